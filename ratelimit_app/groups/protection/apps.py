from .. import GroupConfig


class ProtectionConfig(GroupConfig):
    default = True  # the AppConfig Django picks (GroupConfig, imported here, is not one)
    name = "ratelimit_app.groups.protection"
    label = "ratelimit_protection"
    verbose_name = "Rate limits · Protection"
