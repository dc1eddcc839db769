"""Protection: stopping abusive callers rather than only slowing them down.

``lists`` holds the allow and deny lists as the request path reads them (compiled into the
policy snapshot, matched before any bucket: a listed caller costs no Redis call to refuse).
Layer: below ``config`` and ``metrics``, above ``decision``; imports ``decision`` and the layers
under it, and nothing above.
"""
