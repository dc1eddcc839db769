from .. import GroupConfig


class BillingConfig(GroupConfig):
    default = True  # the AppConfig Django picks (GroupConfig, imported here, is not one)
    name = "ratelimit_app.groups.billing"
    label = "ratelimit_billing"
    verbose_name = "Rate limits · Billing"
