from django.apps import AppConfig


class RatelimitAppConfig(AppConfig):
    name = "ratelimit_app"
    verbose_name = "Rate limits"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.core.signals import setting_changed

        from .conf import reset_config
        from .config.endpoints import forget_unlimited_paths
        from .decision.identity import reset as reset_identity
        from .operations import system_checks  # noqa: F401  (registers the system checks)
        from .runtime import signals  # noqa: F401  (registers the receivers)
        from .runtime.limiter import forget_default_limiter

        # in this order: the settings first, then what was built from them
        setting_changed.connect(reset_config, dispatch_uid="ratelimit_app.reset_config")
        setting_changed.connect(forget_unlimited_paths,
                                dispatch_uid="ratelimit_app.forget_unlimited_paths")
        setting_changed.connect(reset_identity, dispatch_uid="ratelimit_app.reset_identity")
        setting_changed.connect(forget_default_limiter,
                                dispatch_uid="ratelimit_app.forget_default_limiter")
