from .. import GroupConfig


class AlertsConfig(GroupConfig):
    default = True  # the AppConfig Django picks (GroupConfig, imported here, is not one)
    name = "ratelimit_app.groups.alerts"
    label = "ratelimit_alerts"
    verbose_name = "Rate limits · Alerts"
