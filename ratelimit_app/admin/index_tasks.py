"""The app's own index page (``/admin/ratelimit_app/``) by task, for a project without the group
apps (``ratelimit_app/groups/``): there every page of the app is in one section, and this page
shows it as one table per task, in the order an operator works (the quotas, then callers,
billing, alerts, monitoring, protection), with the same names as the group apps' sections.

With the group apps installed the pages live under their groups and this page holds the
quotas only: one table, as before. ``tests/admin/test_index_groups.py`` checks that the tasks
here hold the same models as the group apps.

On the admin's index and on these pages the dashboard comes first, on a line of its own above
the tables (``dashboard_first``), not as a row among the models: it is where an operator
starts.
"""

__all__ = ["TASKS", "by_task", "dashboard_first"]

# The app labels the dashboard's entry can be under (the app's, or its Monitoring group's).
DASHBOARD_APPS = ("ratelimit_app", "ratelimit_monitoring")

# (section name, model names): the group apps' sections, the quotas first.
TASKS = (
    ("Rate limits", ("plan", "rule", "endpointcost")),
    ("Rate limits · Callers", ("apikey", "planassignment", "identityoverride")),
    ("Rate limits · Billing", ("creditaccount", "credittopup", "usagerecord")),
    ("Rate limits · Alerts", ("quotaalert", "webhookendpoint", "webhookdelivery")),
    ("Rate limits · Monitoring", ("auditentry", "dashboard")),
    ("Rate limits · Protection", ("accesslistentry", "banrule", "ban", "banlogentry")),
)


def by_task(app_list):
    """Return ``app_list`` (the admin's list of one app and its models) as one entry per task
    that has models, each shaped like the app's entry; models of no task stay in the first.
    Any other shape is returned as it is."""
    if len(app_list) != 1:
        return app_list
    app = app_list[0]
    sections = {name: [] for name, _ in TASKS}
    task_of = {model_name: name for name, model_names in TASKS for model_name in model_names}
    first = TASKS[0][0]
    for model in app["models"]:
        sections[task_of.get(model["object_name"].lower(), first)].append(model)
    return [{**app, "name": name, "models": models}
            for name, models in sections.items() if models]


def dashboard_first(app_list):
    """Return ``(dashboard, app_list)``: the dashboard's entry of the admin's ``app_list`` (None
    when the user may not see it) and the list without it (a section it leaves empty goes too).
    The list given is not changed."""
    dashboard, rest = None, []
    for app in app_list:
        models = app["models"]
        if app.get("app_label") in DASHBOARD_APPS:
            found = [model for model in models if model.get("object_name") == "Dashboard"]
            if found:
                dashboard = found[0]
                models = [model for model in models if model is not dashboard]
                if not models:
                    continue
        rest.append({**app, "models": models})
    return dashboard, rest
