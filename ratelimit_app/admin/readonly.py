"""``ReadOnlyAdmin``: a model admin whose rows nobody adds, changes or deletes in the admin (the
dashboard, the audit trail, the usage records): the view permission alone decides."""

from django.contrib import admin

__all__ = ["ReadOnlyAdmin"]


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
