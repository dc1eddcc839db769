from .. import GroupConfig


class CallersConfig(GroupConfig):
    default = True  # the AppConfig Django picks (GroupConfig, imported here, is not one)
    name = "ratelimit_app.groups.callers"
    label = "ratelimit_callers"
    verbose_name = "Rate limits · Callers"
