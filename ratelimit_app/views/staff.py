"""Who may read the staff endpoints: active staff users holding a permission."""

from ..decision.headers import plain_problem

__all__ = ["is_staff_with", "refuse_unless_staff_with"]


def is_staff_with(user, permission):
    """Return True if ``user`` (None for no user) is active staff holding ``permission``."""
    return bool(user is not None and user.is_active and user.is_staff
                and user.has_perm(permission))


def refuse_unless_staff_with(request, permission, what):
    """Return a 403 problem unless the request's user is active staff with ``permission``
    (``what`` it allows, for the message), else None."""
    if is_staff_with(getattr(request, "user", None), permission):
        return None
    return plain_problem(403, "Staff only", f"Sign in as staff with the permission to {what} "
                                            f"({permission}).")
