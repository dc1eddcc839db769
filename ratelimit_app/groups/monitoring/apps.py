from .. import GroupConfig


class MonitoringConfig(GroupConfig):
    default = True  # the AppConfig Django picks (GroupConfig, imported here, is not one)
    name = "ratelimit_app.groups.monitoring"
    label = "ratelimit_monitoring"
    verbose_name = "Rate limits · Monitoring"
