"""Model admins for plans, rules, endpoint costs, API keys and overrides."""

from django.contrib import admin

from .models import ApiKey, EndpointCost, IdentityOverride, Plan, PlanAssignment, Rule


class RuleInline(admin.TabularInline):
    model = Rule
    extra = 0
    fields = ["name", "scope", "endpoint", "rate", "period_s", "burst", "mode", "enabled"]


class EndpointCostInline(admin.TabularInline):
    model = EndpointCost
    extra = 0


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "default_for_authenticated", "default_for_anonymous"]
    search_fields = ["slug", "name"]
    inlines = [RuleInline, EndpointCostInline]


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    list_display = ["name", "plan", "scope", "endpoint", "rate", "period_s", "burst", "mode",
                    "enabled"]
    list_filter = ["plan", "scope", "mode", "enabled"]
    search_fields = ["name", "endpoint"]


@admin.register(EndpointCost)
class EndpointCostAdmin(admin.ModelAdmin):
    list_display = ["endpoint", "method", "plan", "cost"]
    list_filter = ["plan", "method"]
    search_fields = ["endpoint"]


@admin.register(PlanAssignment)
class PlanAssignmentAdmin(admin.ModelAdmin):
    list_display = ["user", "plan", "tenant"]
    list_filter = ["plan"]
    search_fields = ["user__username", "tenant"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "name", "user", "plan", "tenant", "active"]
    list_filter = ["plan", "active"]
    search_fields = ["prefix", "name", "user__username"]


@admin.register(IdentityOverride)
class IdentityOverrideAdmin(admin.ModelAdmin):
    list_display = ["__str__", "rule", "exempt", "note"]
    list_filter = ["exempt"]
