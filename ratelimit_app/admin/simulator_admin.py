"""``SimulatorAdmin``: the simulator's own entry in the index (Monitoring), when that group app
is installed; without it the simulator is a page beside the rules ("Simulate a request").

The page is the rules admin's (``RuleAdmin.simulator_view``: its form, its permission, view
the rules); this admin gives it a place, named after the table-less ``Simulator`` model of
``ratelimit_app.groups.monitoring``.
"""

from django.urls import path

from ..config.models import Rule
from .readonly import ReadOnlyAdmin

__all__ = ["SimulatorAdmin"]


class SimulatorAdmin(ReadOnlyAdmin):
    """No rows: the changelist is the simulator."""

    def _rule_admin(self):
        return self.admin_site.get_model_admin(Rule)

    def has_module_permission(self, request):
        return self._rule_admin().has_view_permission(request)

    def has_view_permission(self, request, obj=None):
        return self._rule_admin().has_view_permission(request)

    def get_urls(self):
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def changelist_view(self, request, extra_context=None):
        """The simulator's page, its breadcrumbs under this entry."""
        response = self._rule_admin().simulator_view(request)
        response.context_data["opts"] = self.opts
        return response
