"""The audit trail in the admin: who changed the quota configuration and how, per object and
for the whole configuration, and a restore of any entry through the import path.

``AuditedAdminMixin`` goes on the admins of quota rows: their saves, deletes and changelist
actions are recorded as made by the signed-in user, and each change page links to the history
of its object. ``AuditEntryAdmin`` is read-only; its restore page shows the import's dry run
first and applies it on confirmation (permission ``ratelimit_app.restore_configuration``).
"""

from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from ..config import audit
from ..config.models import AuditEntry, AuditSource
from ..config.quotas_as_code import QuotaFileError, describe_change
from .placement import admin_url_name
from .readonly import ReadOnlyAdmin

__all__ = ["AuditedAdminMixin", "AuditEntryAdmin", "RESTORE_PERMISSION"]

RESTORE_PERMISSION = "ratelimit_app.restore_configuration"


def history_url(obj):
    """Return the URL of the audit entries that touched ``obj``, or None."""
    token = audit.object_token(obj)
    if token is None:
        return None
    return reverse(admin_url_name(AuditEntry, "changelist")) + "?" + \
        urlencode({TouchedFilter.parameter_name: token})


class AuditedAdminMixin:
    """Record this admin's changes as made by the signed-in user; link each change page to its
    object's history."""

    change_form_template = "admin/ratelimit_app/audited_change_form.html"

    def _acting(self, request):
        actor = audit.Actor(request.user.get_username(), AuditSource.ADMIN, user=request.user)
        return audit.acting_as(actor)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        obj = self.get_object(request, object_id) if object_id else None
        if obj is not None:
            extra_context = {**(extra_context or {}), "audit_history_url": history_url(obj)}
        with self._acting(request):
            return super().changeform_view(request, object_id, form_url, extra_context)

    def delete_view(self, request, object_id, extra_context=None):
        with self._acting(request):
            return super().delete_view(request, object_id, extra_context)

    def changelist_view(self, request, extra_context=None):
        with self._acting(request):  # actions (delete selected) and list_editable saves
            return super().changelist_view(request, extra_context)


class TouchedFilter(admin.SimpleListFilter):
    """The entries that touched one object (the link on its change page)."""

    title = "object"
    parameter_name = "touched"

    def lookups(self, request, model_admin):
        value = request.GET.get(self.parameter_name)
        return [(value, value.replace("|", " "))] if value else []

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(touched__contains=f"\n{self.value()}\n")
        return queryset


class AuditEntryAdmin(ReadOnlyAdmin):
    """Read-only: entries are written by ``config/audit.py`` only."""

    list_display = ["id", "created", "actor", "source", "summary", "restore_link"]
    list_filter = ["source", TouchedFilter]
    search_fields = ["actor", "summary"]
    fields = ["created", "actor", "source", "summary", "changes", "restored_from",
              "restore_link", "configuration"]
    readonly_fields = fields

    @admin.display(description="changes")
    def changes(self, entry):
        return format_html("<pre class=\"ratelimit-audit-diff\">{}</pre>",
                           "\n".join(audit.describe(entry.diff)) or "(the first entry)")

    def get_queryset(self, request):
        # the whole configuration, in checkpoints only, is read where it is shown
        return super().get_queryset(request).defer("snapshot")

    @admin.display(description="configuration after the change")
    def configuration(self, entry):
        from ..config.quotas_as_code import dumps

        try:
            document = audit.document_of(entry)
        except audit.AuditTrailGap as exc:
            return f"Cannot be rebuilt: {exc}."
        return format_html("<pre>{}</pre>", dumps(document))

    @admin.display(description="restore")
    def restore_link(self, entry):
        url = reverse(admin_url_name(AuditEntry, "restore"), args=[entry.pk])
        return format_html('<a class="ratelimit-restore" href="{}">Restore this '
                           'configuration…</a>', url)

    def get_urls(self):
        restore = path("<int:entry_id>/restore/",
                       self.admin_site.admin_view(self.restore_view),
                       name="ratelimit_app_auditentry_restore")
        return [restore, *super().get_urls()]

    def restore_view(self, request, entry_id):
        """GET: the dry run (what the restore would add, change and remove). POST with
        ``confirm``: restore it in one transaction, recorded as a restore by this user."""
        if not request.user.has_perm(RESTORE_PERMISSION):
            raise PermissionDenied
        entry = AuditEntry.objects.filter(pk=entry_id).first()
        if entry is None:
            raise Http404("No such audit entry.")
        changelist = reverse(admin_url_name(AuditEntry, "changelist"))
        if request.method == "POST" and request.POST.get("confirm") == "yes":
            try:
                plan = audit.restore(entry, request.user)
            except QuotaFileError as exc:
                return self._restore_page(request, entry, errors=exc.errors)
            if plan.changes:
                messages.success(request, f"Restored the configuration of entry #{entry.pk} "
                                          f"({len(plan.changes)} rows changed).")
            else:
                messages.info(request, f"The configuration already was that of entry "
                                       f"#{entry.pk}; nothing changed.")
            return HttpResponseRedirect(changelist)
        try:
            plan = audit.restore_plan(entry)
        except QuotaFileError as exc:
            return self._restore_page(request, entry, errors=exc.errors)
        return self._restore_page(request, entry, plan=plan)

    def _restore_page(self, request, entry, plan=None, errors=()):
        lines = [line for change in (plan.changes if plan else ())
                 for line in describe_change(change)]
        lines += [f"Warning: {warning}" for warning in (plan.warnings if plan else ())]
        context = {**self.admin_site.each_context(request), "opts": self.opts,
                   "title": f"Restore the configuration of entry #{entry.pk}?",
                   "entry": entry, "lines": lines, "errors": list(errors),
                   "has_changes": bool(plan and plan.changes)}
        return TemplateResponse(request, "admin/ratelimit_app/auditentry/restore.html", context)
