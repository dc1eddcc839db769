"""Protection: stopping abusive callers, not only slowing them down.

The failed-authentication gate, the penalty box, and the allow and deny lists (``lists``:
compiled into the policy snapshot and matched before any bucket, so a listed caller costs no
Redis call). Layer: below ``config`` and ``metrics``, above ``decision``; imports ``decision``
and the layers under it, nothing above.
"""
