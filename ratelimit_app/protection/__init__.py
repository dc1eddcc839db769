"""Protection: stopping abusive callers rather than only slowing them.

``failed_auth`` (the failed-authentication gate: a client address out of failed
authentications may not try credentials it has not proven from there), ``bans`` (the penalty
box: ban rules compiled into the snapshot, the ban checked in the same take.lua call as the
buckets, events counted by ``ban.lua``), ``lists`` (the allow and deny lists: compiled into the
snapshot and matched before any bucket, so a listed caller costs no Redis call). The runtime's
Limiter calls these; they call the store through the Limiter's guarded calls. Layer: below
``config`` and ``metrics`` (whose compiler builds their compiled form from here), above
``decision``; imports ``decision``, ``stores``, ``process`` and ``conf`` only.
"""
