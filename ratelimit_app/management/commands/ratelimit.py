"""``manage.py ratelimit <subcommand>``: quotas as code and the operator's tools.

    export [--output FILE]                      the quota rows as JSON (natural keys, stable)
    import FILE [--dry-run] [--keep-missing] [--allow-everyone]
                                                make the database hold FILE, one version bump
    check                                       system checks, store, script, a scratch decision,
                                                version, clock skew
    reload                                      every worker reloads the quota rows (~1 s)
    inspect IDENTITY [--endpoint E --method M]  a client's buckets, nothing debited
    reset IDENTITY --user STAFF [--yes]         the admin's reset, recorded in the admin history
    top [--window 1h]                           the dashboard's hot keys and 429 rates
    deliver [--once]                            send the alert webhooks (a long-running sender)
    rollup [--every SECONDS]                    add the usage counted in Redis into the usage
                                                records (exactly once), then checkpoint the
                                                credit balances (--every: keep doing both)
    usage --from DAY --to DAY [--tenant T] [--identity REF] [--period day|month]
          [--format csv|json] [--output FILE]   the usage records for billing
    credits top-up ACCOUNT UNITS --id ID [--note TEXT]
                                                credit prepaid units once per ID
    credits show ACCOUNT                        an account's balance and last top-up
    bans [list]                                 the bans in force (the penalty box)
    bans lift BAN_ID --user STAFF               end a ban now, recorded in the audit trail

Exit codes: 0 done, 1 a check failed or Redis is unavailable, 2 bad input (an unknown identity,
an unreadable or invalid file, a top-up id used for another top-up).
"""

import datetime
import json
import logging
import sys

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from ... import metrics
from ...admin.dashboard.admin import RESET_PERMISSION
from ...admin.dashboard.data import dashboard_data
from ...admin.dashboard.inspector import (acting_keys, bucket_rows, find_identity,
                                          reset_and_record)
from ...admin.dashboard.text import bucket_lines, counted, top_lines
from ...business.alerts.webhooks import Sender
from ...business.credits.ledger import (
    TopUpConflict,
    balance,
    checkpoint,
    client_of,
    top_up,
)
from ...business.credits.refs import CreditInputError, units_of_text
from ...business.credits.rules import AccountRules
from ...business.usage.records import (
    DAY,
    FORMATS,
    MONTH,
    UsageQueryError,
    parse_range,
    render,
    usage_rows,
)
from ...business.usage.rollup import UsageRollup
from ...config.audit import Actor, acting_as
from ...config.models import AuditSource
from ...config.quotas_as_code import (
    QuotaFileError,
    apply_import,
    describe_change,
    dumps,
    export_document,
    plan_import,
)
from ...operations.readiness import FAIL, OK, run_operator_checks
from ...process.stop_signal import StopSignal
from ...runtime.limiter import default_limiter
from ...stores import StoreUnavailable
from ...stores.base import READ_ERRORS

logger = logging.getLogger("ratelimit_app")

FAILED = 1
BAD_INPUT = 2


def _bad_input(message):
    return CommandError(message, returncode=BAD_INPUT)


def _redis_down(message, exc):
    return CommandError(f"Redis is unavailable; {message} ({exc}).", returncode=FAILED)


class Command(BaseCommand):
    help = ("Quotas as code (export, import), operator tools (check, reload, inspect, reset, "
            "top), usage records (rollup, usage) and prepaid credits (credits).")
    # ``check`` runs the system checks itself; the others need not wait for a store check
    requires_system_checks = []

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="subcommand", required=True,
                                         metavar="{export,import,check,reload,inspect,reset,top,"
                                                 "deliver,rollup,usage,credits,bans}")
        export = commands.add_parser("export", help="Write the quota rows as JSON.")
        export.add_argument("--output", "-o", metavar="FILE",
                            help="Write to FILE instead of standard output.")

        load = commands.add_parser("import", help="Make the quota rows those of FILE.")
        load.add_argument("file", metavar="FILE", help="A file export wrote; - reads stdin.")
        load.add_argument("--dry-run", action="store_true",
                          help="Print what would be added, changed and removed; change nothing.")
        load.add_argument("--keep-missing", action="store_true",
                          help="Keep rows absent from FILE (default: remove them).")
        load.add_argument("--allow-everyone", action="store_true",
                          help="Import list entries that deny, or exempt from quotas, a whole "
                               "address family (0.0.0.0/0, ::/0); refused without it.")

        commands.add_parser("check", help="Is the store ready? Lines OK/WARN/FAIL; exit 1 on FAIL.")
        commands.add_parser("reload", help="Make every worker reload the quota rows now (for "
                                           "rows changed by update(), bulk_create, raw SQL).")

        for name, text in (("inspect", "Show a client's buckets (nothing debited)."),
                           ("reset", "Refill a client's own buckets, as the admin's reset.")):
            sub = commands.add_parser(name, help=text)
            sub.add_argument("identity", help="A username, an API key prefix, an IP address, "
                                              "or a ref such as user:3, key:7, ip:203.0.113.5.")
            if name == "inspect":
                sub.add_argument("--endpoint", help="Only the buckets a request to this "
                                                    "endpoint (URL name) is charged against.")
                sub.add_argument("--method", default="GET",
                                 help="With --endpoint: the request's method (costs may differ).")
            else:
                sub.add_argument("--user", required=True, metavar="USERNAME",
                                 help="The staff account the admin history records the reset "
                                      "under (needs the reset_buckets permission).")
                sub.add_argument("--yes", action="store_true", help="Do not ask to confirm.")

        top = commands.add_parser("top", help="The dashboard's hot keys and 429 rates.")
        top.add_argument("--window", default="1h", choices=list(metrics.WINDOWS))

        deliver = commands.add_parser("deliver", help="Send the alert webhooks in the outbox, "
                                                      "until stopped (SIGINT or SIGTERM).")
        deliver.add_argument("--once", action="store_true",
                             help="Send what is due now, then exit.")

        rollup = commands.add_parser("rollup", help="Add the usage counted in Redis into the "
                                                    "usage records (exactly once), then "
                                                    "checkpoint every prepaid credit balance "
                                                    "into the database.")
        rollup.add_argument("--every", type=float, metavar="SECONDS",
                            help="Keep doing both every SECONDS until stopped (a process of "
                                 "its own, as `make run` starts).")

        usage = commands.add_parser("usage", help="The usage records for billing, as CSV or "
                                                  "JSON.")
        usage.add_argument("--from", dest="date_from", required=True, metavar="YYYY-MM-DD",
                           help="First day (in CALENDAR_TIME_ZONE).")
        usage.add_argument("--to", dest="date_to", required=True, metavar="YYYY-MM-DD",
                           help="Last day, included.")
        usage.add_argument("--tenant", help="Only this tenant's callers.")
        usage.add_argument("--identity", metavar="REF",
                           help="Only this caller (key:ID, user:ID or anonymous).")
        usage.add_argument("--period", choices=(DAY, MONTH), default=DAY,
                           help="One row per day (default) or per month.")
        usage.add_argument("--format", dest="output_format", choices=list(FORMATS),
                           default="csv")
        usage.add_argument("--output", "-o", metavar="FILE",
                           help="Write to FILE instead of standard output.")

        credits = commands.add_parser("credits", help="Prepaid credits: top up an account, "
                                                      "show its balance.")
        credit_commands = credits.add_subparsers(dest="credits_command", required=True,
                                                 metavar="{top-up,show}")
        account_help = "key:<API key id>, user:<user id> or tenant:<name>."
        credit = credit_commands.add_parser("top-up", help="Credit prepaid units to an "
                                                           "account, once per --id.")
        credit.add_argument("account", metavar="ACCOUNT", help=account_help)
        credit.add_argument("units", metavar="UNITS", help="A whole number from 1 to 10^12.")
        credit.add_argument("--id", dest="top_up_id", required=True, metavar="TOP_UP_ID",
                            help="Your reference for this top-up (an invoice number): run "
                                 "again with the same id, it credits nothing again.")
        credit.add_argument("--note", default="", help="Why (shown in the admin).")
        show = credit_commands.add_parser("show", help="An account's balance, granted and "
                                                       "spent units and last top-up.")
        show.add_argument("account", metavar="ACCOUNT", help=account_help)

        bans = commands.add_parser("bans", help="The penalty box: list the bans in force, lift "
                                                "one.")
        ban_commands = bans.add_subparsers(dest="bans_command", metavar="{list,lift}")
        ban_commands.add_parser("list", help="The bans in force: who, why, since, until, times.")
        lift = ban_commands.add_parser("lift", help="End a ban now (audited).")
        lift.add_argument("ban_id", type=int, metavar="BAN_ID", help="The ban's number (bans "
                                                                     "list shows it).")
        lift.add_argument("--user", required=True, metavar="USERNAME",
                          help="The staff account the audit trail records the lift under "
                               "(needs the lift_ban permission).")

    def handle(self, *args, subcommand, **options):
        handler = getattr(self, "handle_" + subcommand)
        handler(**options)

    # --- quotas as code --------------------------------------------------------------------

    def handle_export(self, output=None, **options):
        self._write(dumps(export_document()), output)

    def _write(self, text, output):
        if output is None:
            self.stdout.write(text, ending="")
            return
        try:
            with open(output, "w", encoding="utf-8") as file:
                file.write(text)
        except OSError as exc:
            raise _bad_input(f"Cannot write {output}: {exc.strerror}.")
        self.stderr.write(f"Wrote {output}.")

    def _read_document(self, path):
        try:
            if path == "-":
                text = sys.stdin.read()
            else:
                with open(path, encoding="utf-8") as file:
                    text = file.read()
        except OSError as exc:
            raise _bad_input(f"Cannot read {path}: {exc.strerror}.")
        except UnicodeDecodeError as exc:
            raise _bad_input(f"{path} is not UTF-8 text: {exc.reason} at byte {exc.start}.")
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise _bad_input(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}, "
                             f"column {exc.colno}.")
        except RecursionError:
            raise _bad_input(f"{path} nests lists or objects too deeply to be a quotas file "
                             f"(what export writes is 3 levels deep).") from None
        except ValueError:
            # the one ValueError json.loads raises besides JSONDecodeError: an integer of more
            # digits than Python converts (in words of our own: Python's change by version)
            raise _bad_input(f"{path} cannot be read: a number in it has more than "
                             f"{sys.get_int_max_str_digits()} digits.") from None

    def handle_import(self, file, dry_run=False, keep_missing=False, allow_everyone=False,
                      **options):
        document = self._read_document(file)
        try:
            # the same validation for a dry run and an import (quotas_as_code's docstring)
            plan = plan_import(document, keep_missing=keep_missing,
                               allow_everyone=allow_everyone)
        except QuotaFileError as exc:
            raise self._invalid(file, exc)
        for change in plan.changes:
            for line in describe_change(change):
                self.stdout.write(line)
        for warning in plan.warnings:
            self.stdout.write(self.style.WARNING(f"Warning (--allow-everyone): {warning}"))
        if plan.kept:
            self.stdout.write(f"{counted(plan.kept, 'row')} absent from the file kept "
                              f"(--keep-missing).")
        if not plan.changes:
            self.stdout.write("Nothing to change.")
            return
        counts = {action: sum(c.action == action for c in plan.changes)
                  for action in ("add", "change", "remove")}
        summary = f"{counts['add']} added, {counts['change']} changed, {counts['remove']} removed"
        if dry_run:
            self.stdout.write(f"Dry run: would be {summary}; nothing changed.")
            return
        limiter = default_limiter()
        try:
            # workers learn of the import only through the version bump: no Redis, no import
            limiter.store.ping()
        except StoreUnavailable as exc:
            raise _redis_down("nothing imported (workers could not be told to reload)", exc)
        try:
            with acting_as(Actor("manage.py ratelimit import", AuditSource.IMPORT)):
                apply_import(plan.changes)  # one audit entry, at the commit
        except QuotaFileError as exc:
            raise self._invalid(file, exc)
        try:
            version = limiter.read_version()
        except StoreUnavailable as exc:
            raise _redis_down(f"imported ({summary}), but the change may not have been "
                              f"announced: workers reload at the next announced quota change",
                              exc)
        self.stdout.write(self.style.SUCCESS(f"Imported: {summary}; config version {version}."))

    def _invalid(self, path, exc):
        for error in exc.shown_errors():
            self.stderr.write(error)
        return _bad_input(f"{path}: {counted(len(exc.errors), 'error')}; nothing changed.")

    # --- operator tools --------------------------------------------------------------------

    def handle_check(self, **options):
        lines = run_operator_checks()
        for line in lines:
            style = self.style.ERROR if line.level == FAIL else \
                self.style.WARNING if line.level != OK else self.style.SUCCESS
            self.stdout.write(style(str(line)))
        failed = sum(line.level == FAIL for line in lines)
        if failed:
            raise CommandError(f"{counted(failed, 'check')} failed.", returncode=FAILED)

    def handle_reload(self, **options):
        limiter = default_limiter()
        try:
            previous = limiter.read_version()
            version = limiter.bump_config_version()
        except StoreUnavailable as exc:
            raise _redis_down("workers were not told to reload", exc)
        snapshot = limiter.snapshot()  # what every worker compiles now, from the same rows
        self.stdout.write(self.style.SUCCESS(
            f"Config version {previous} -> {version}: every worker reloads the quota rows "
            f"within about a second."))
        if snapshot.version == "unknown":  # the database did not answer (the error is logged)
            raise CommandError("The quota rows could not be read here; workers keep the rules "
                               "they hold until they can read them.", returncode=FAILED)
        self.stdout.write(f"They now hold {len(snapshot.rules)} enabled rule(s), "
                          f"{len(snapshot.plans)} plan(s), {len(snapshot.costs)} endpoint "
                          f"cost(s), {len(snapshot.api_keys)} active API key(s).")

    def handle_deliver(self, once=False, **options):
        sender = Sender()
        if once:
            sent, failed = sender.send_due()
            sent_text = counted(sent, "delivery", "deliveries")
            self.stdout.write(f"{sent_text} sent, {counted(failed, 'attempt')} failed (retried "
                              f"later).")
            return
        stop = StopSignal()
        self.stdout.write("Sending webhook deliveries; stop with Ctrl-C.")
        self.stdout.flush()
        sender.run(stop)
        self.stdout.write("Webhook sender stopped.")

    def _lookup(self, query):
        snapshot = default_limiter().snapshot()
        lookup = find_identity(query, snapshot)
        if lookup.identity is None:
            if lookup.choices:
                listed = "; ".join(f"{ref} ({label})" for ref, label in lookup.choices)
                raise _bad_input(f"“{query}” matches several API keys; name one: {listed}.")
            raise _bad_input(f"No client matches “{query}” (a username, an API key prefix, "
                             f"an IP address, or user:ID, key:ID, ip:ADDRESS).")
        return lookup, snapshot

    def handle_inspect(self, identity, endpoint=None, method="GET", **options):
        lookup, snapshot = self._lookup(identity)
        who = lookup.identity
        self.stdout.write(f"{lookup.label}: plan {who.plan or '—'}, tenant {who.tenant or '—'}"
                          + (f", {method} {endpoint}" if endpoint else ""))
        try:
            rows, exempt = bucket_rows(who, snapshot, endpoint=endpoint, method=method.upper())
        except StoreUnavailable as exc:
            raise _redis_down("the buckets cannot be read", exc)
        if exempt:
            self.stdout.write("Exempt from every limit (an identity override).")
        elif not rows:
            self.stdout.write("No rule applies.")
        else:
            for line in bucket_lines(rows):
                self.stdout.write(line)
            if endpoint is None:
                self.stdout.write("Costs depend on the endpoint: add --endpoint NAME.")

    def handle_reset(self, identity, user, yes=False, **options):
        User = get_user_model()
        operator = User.objects.filter(**{User.USERNAME_FIELD: user}).first()
        if operator is None or not operator.is_active or not operator.is_staff or \
                not operator.has_perm(RESET_PERMISSION):
            raise _bad_input(f"“{user}” is not an active staff user with the "
                             f"{RESET_PERMISSION} permission; the reset is recorded under it.")
        lookup, snapshot = self._lookup(identity)
        if not yes:
            keys = acting_keys(lookup.identity)
            with_keys = f", and those of its {counted(len(keys), 'API key')}," if keys else ""
            self.stdout.write(f"Reset the buckets of {lookup.label}? Its own user/key and IP "
                              f"buckets{with_keys} are refilled; shared buckets stay. [y/N] ",
                              ending="")
            self.stdout.flush()
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                self.stdout.write("Nothing was reset.")
                return
        try:
            message = reset_and_record(lookup, snapshot, operator,
                                       source="manage.py ratelimit reset")
        except StoreUnavailable as exc:
            raise _redis_down("nothing was reset", exc)
        self.stdout.write(self.style.SUCCESS(message))

    def handle_top(self, window="1h", **options):
        data = dashboard_data(window, with_html=False)
        health = data["health"]
        if not health["redis_ok"]:
            raise CommandError(f"Redis is unavailable: {health['redis_error']}",
                               returncode=FAILED)
        for line in top_lines(data):
            self.stdout.write(line)

    # --- usage records ---------------------------------------------------------------------

    def handle_rollup(self, every=None, **options):
        if every is None:
            try:
                result = self._roll_up()
            except READ_ERRORS as exc:
                raise _redis_down("the usage counts were not rolled up", exc)
            self.stdout.write(
                f"Rolled up {counted(result.batches, 'batch', 'batches')} into "
                f"{counted(result.records, 'usage record')}"
                + (f"; {result.already_added} added before, now deleted from Redis"
                   if result.already_added else "") + ".")
            try:
                credits = self._checkpoint()
            except READ_ERRORS as exc:
                raise _redis_down("the credit balances were not checkpointed", exc)
            if credits.accounts:  # silent where prepaid credits are not used
                self.stdout.write(_checkpointed(credits))
            return
        if every <= 0:
            raise _bad_input("--every must be a positive number of seconds.")
        stop = StopSignal()
        self.stdout.write(f"Rolling up the usage counts every {every:g} s, then checkpointing "
                          f"the credit balances (stop with Ctrl-C or SIGTERM).")
        self.stdout.flush()
        while True:
            # each step on its own: a failed rollup does not hold back the checkpoint
            for what, step in (("usage rollup", self._roll_up),
                               ("credits checkpoint", self._checkpoint)):
                try:
                    step()
                except READ_ERRORS as exc:  # Redis down: what it holds waits; try again later
                    logger.warning("ratelimit_app: %s failed (%s); retrying in %g s", what,
                                   exc, every)
                except Exception:  # a database error: logged; the next round tries again
                    logger.exception("ratelimit_app: %s failed", what)
            if stop.wait(every):
                break
        self.stdout.write("Usage rollup stopped.")

    def _roll_up(self):
        return UsageRollup(default_limiter().store.metrics_client()).run()

    def _checkpoint(self):
        limiter = default_limiter()
        # the rules in force say which accounts alert (business/credits/alerts.py)
        return checkpoint(limiter.store.metrics_client(), snapshot=limiter.snapshot())

    def handle_usage(self, date_from, date_to, tenant=None, identity=None, period=DAY,
                     output_format="csv", output=None, **options):
        try:
            first, last = parse_range(date_from, date_to)
            rows = usage_rows(first, last, tenant=tenant, identity=identity, period=period)
            text, _content_type = render(rows, first, last, period, output_format)
        except UsageQueryError as exc:
            raise _bad_input(str(exc))
        self._write(text if text.endswith("\n") else text + "\n", output)

    # --- the penalty box -------------------------------------------------------------------

    def handle_bans(self, bans_command=None, ban_id=None, user=None, **options):
        from ...config.ban_records import current_bans, unlisted_bans
        from ...config.models import Ban

        if bans_command != "lift":
            found = list(current_bans())
            for ban in found:
                self.stdout.write(f"#{ban.pk}  {ban.who}  by {ban.rule_name}  since "
                                  f"{ban.since:%Y-%m-%d %H:%M:%S}  until "
                                  f"{ban.until:%Y-%m-%d %H:%M:%S}  ban {ban.times}")
            if not found:
                self.stdout.write("No ban in force.")
            # a flood's bans past BAN_ROWS_PER_INTERVAL have no row: say how many
            since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
            for entry, unlisted in unlisted_bans(since):
                self.stdout.write(f"(and {unlisted} more banned by {entry.rule_name} in the "
                                  f"interval from {entry.interval_start:%Y-%m-%d %H:%M:%S}: "
                                  f"not listed, refused by Redis until their ban ends)")
            return
        User = get_user_model()
        operator = User.objects.filter(**{User.USERNAME_FIELD: user}).first()
        if operator is None or not operator.is_active or not operator.is_staff or \
                not operator.has_perm("ratelimit_app.lift_ban"):
            raise _bad_input(f"“{user}” is not an active staff user with the "
                             f"ratelimit_app.lift_ban permission; the lift is recorded under it.")
        ban = Ban.objects.filter(pk=ban_id, shadow=False, lifted_at=None).first()
        if ban is None:
            raise _bad_input(f"No ban #{ban_id} in force (see manage.py ratelimit bans list).")
        try:
            default_limiter().protection.lift_ban(
                ban, Actor(operator.get_username(), AuditSource.ADMIN, user=operator))
        except StoreUnavailable as exc:
            raise _redis_down("the ban was not lifted", exc)
        self.stdout.write(self.style.SUCCESS(f"Lifted ban #{ban.pk} of {ban.who} by "
                                             f"{ban.rule_name}."))

    # --- prepaid credits -------------------------------------------------------------------

    def handle_credits(self, credits_command, account, **options):
        if credits_command == "top-up":
            self._top_up(account, **options)
        else:
            self._show_credits(account)

    def _top_up(self, account, units, top_up_id, note="", **options):
        client = client_of(default_limiter().store)
        try:
            made, created = top_up(account, units_of_text(units), top_up_id, note=note,
                                   client=client,
                                   actor="manage.py ratelimit credits top-up")
        except (CreditInputError, TopUpConflict) as exc:
            raise _bad_input(str(exc))
        account = made.account
        if created:
            self.stdout.write(self.style.SUCCESS(
                f"Credited {counted(made.units, 'unit')} to {account} (top-up {top_up_id}); "
                f"granted in all: {counted(account.granted, 'unit')}."))
        else:
            self.stdout.write(f"Top-up {top_up_id} was made before ({counted(made.units, 'unit')}"
                              f" to {account.ref}, {_when(made.created)}); nothing credited "
                              f"again.")

    def _show_credits(self, account):
        try:
            found = balance(account, default_limiter().store.metrics_client())
        except CreditInputError as exc:
            raise _bad_input(str(exc))
        except READ_ERRORS as exc:
            raise _redis_down("the balance cannot be read", exc)
        if found is None:
            raise _bad_input(f"{account} has no credit account: it has had no top-up, and no "
                             f"credits rule has charged it.")
        for line in _balance_lines(found, AccountRules(default_limiter().snapshot())):
            self.stdout.write(line)


def _when(moment):
    """``moment`` in UTC, to the second (``2026-11-27 18:04:05 UTC``)."""
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _checkpointed(result):
    """The line ``rollup`` prints about the credits checkpoint."""
    details = [(count, text) for count, text in (
        (result.seeded, "set from the database (Redis had none)"),
        (result.restored, "restored (Redis held an older state)"),
        (result.raised, "given top-ups Redis had missed")) if count]
    return (f"Checkpointed {counted(result.accounts, 'credit balance')}"
            + "".join(f"; {count} {text}" for count, text in details) + ".")


def _balance_lines(found, rules):
    """The lines of ``credits show``: the allowance (found in ``rules``, an AccountRules of the
    rules in force), what the period consumed and the units left (figures.py), then the
    ledger's numbers."""
    state, account, last = found.state, found.account, found.last_top_up
    figures = found.figures(rules)
    allowance = figures.allowance
    lines = [f"{account}", f"allowance      {allowance.in_words()}"]
    if allowance.known and allowance.units:
        lines.append(f"allowance used {counted(figures.allowance_used, 'unit')}, "
                     f"{figures.allowance_left} left")
    period = f"in the period from {_when(figures.period_start)}" if figures.period_start \
        else "so far"
    lines += [f"consumed       {counted(figures.used_in_period, 'unit')} {period} (the "
              f"allowance first, then prepaid units)",
              f"prepaid left   {counted(figures.prepaid_left, 'unit')}",
              "units left     " + (counted(figures.units_left, 'unit') if allowance.known
                                   else "unknown, as the allowance is"),
              f"granted        {counted(state.granted, 'unit')}",
              f"spent          {counted(state.spent, 'unit')} (prepaid, in all)"]
    lines.append("last top-up    " + (
        f"{last.top_up_id}: {counted(last.units, 'unit')}, {_when(last.created)}, by "
        f"{last.actor}" + (f" ({last.note})" if last.note else "") if last else "none"))
    lines.append("checkpointed   " + (_when(account.checkpointed_at)
                                      if account.checkpointed_at else "never"))
    if found.source == "checkpoint":
        lines.append("Redis holds no balance for it yet: these are the database's numbers, "
                     "set in Redis at its first request or the next checkpoint.")
    if found.pending_units:
        lines.append(f"{counted(found.pending_units, 'unit')} of top-ups are not in Redis yet: "
                     f"the next checkpoint (manage.py ratelimit rollup) applies them.")
    return lines
