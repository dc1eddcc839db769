"""The caller's page: one API key, signed-in user or client IP, whole, with its actions.

    caller.py       who the page is about (from what an operator typed, via the inspector's
                    find_identity), and its plan with where the plan comes from
    limits.py       every rule that applies, in the rules list's words, with what is left now
                    (one non-debiting Redis read for the page) and when it runs out
    pace.py         the run-out estimate: at the caller's recent pace, when a quota or a
                    balance is used up
    history.py      its last 24 hours (metrics/caller_history.py; the hot-key sketch for an
                    address) and the chart of them
    related.py      its overrides, credit accounts, bans and usage, each with its action
    views.py        the page and its actions (end an override, lift a ban), served by the
                    dashboard's admin (admin/dashboard/admin.py)
"""
