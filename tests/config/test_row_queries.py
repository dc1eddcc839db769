"""row_queries.rows_by_id: a few config rows by primary key, through a query the ORM builds
once per model, columns and number of rows. On the test database (SQLite, or PostgreSQL with
RATELIMIT_TEST_DATABASE=postgresql): what it returns must be what the ORM's own query returns,
the database's values converted as the ORM converts them, whichever keys each call asks for.
"""

from datetime import datetime, timezone

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ratelimit_app.config.row_queries import rows_by_id, with_keys
from ratelimit_app.models import ApiKey, Plan, PlanAssignment

pytestmark = pytest.mark.django_db

FIELDS = ("id", "user_id", "plan__slug", "tenant", "starts_at", "ends_at")
KEY_FIELDS = ("id", "prefix", "plan__slug", "active", "starts_at")


def by_id(rows):
    return sorted(rows, key=lambda row: row.id)


def orm_rows(model, fields, keys, **filters):
    """The ORM's own rows (in the order the database gives, like ``rows_by_id``'s: ordered by
    id here, since a table without a default order may give either in any)."""
    return by_id(model.objects.filter(pk__in=keys, **filters).values_list(*fields, named=True))


@pytest.fixture
def assignments():
    pro = Plan.objects.create(slug="pro", name="Pro")
    users = User.objects.bulk_create([User(username=f"q{i}") for i in range(4)])
    starts = datetime(2026, 11, 1, 12, 30, tzinfo=timezone.utc)
    return [PlanAssignment.objects.create(user=user, plan=pro, tenant=f"t{i}",
                                          starts_at=starts if i % 2 else None)
            for i, user in enumerate(users)]


def test_the_rows_asked_for_come_back_as_the_orm_returns_them(assignments):
    keys = {assignments[1].pk, assignments[3].pk}
    found = by_id(rows_by_id(PlanAssignment, FIELDS, keys))
    assert found == orm_rows(PlanAssignment, FIELDS, keys)
    assert [row.id for row in found] == sorted(keys)
    row = found[0]
    assert row.plan__slug == "pro" and row._fields == FIELDS
    # a date is converted as the ORM converts it: an aware datetime, not the database's text
    assert row.starts_at == datetime(2026, 11, 1, 12, 30, tzinfo=timezone.utc)


def test_the_query_built_once_reads_each_call_s_own_keys_and_current_values(assignments):
    first, second = assignments[0].pk, assignments[2].pk
    assert [row.id for row in rows_by_id(PlanAssignment, FIELDS, {first})] == [first]
    PlanAssignment.objects.filter(pk=second).update(tenant="moved")
    with CaptureQueriesContext(connection) as captured:
        found = rows_by_id(PlanAssignment, FIELDS, {second})
    assert [(row.id, row.tenant) for row in found] == [(second, "moved")]
    assert len(captured.captured_queries) == 1
    # a key that no longer exists is simply not returned; no key at all asks nothing
    PlanAssignment.objects.filter(pk=first).delete()
    assert [row.id for row in rows_by_id(PlanAssignment, FIELDS, {first, second})] == [second]
    with CaptureQueriesContext(connection) as captured:
        assert rows_by_id(PlanAssignment, FIELDS, set()) == []
    assert captured.captured_queries == []


def test_filters_keep_their_values_beside_the_keys():
    user = User.objects.create(username="keys")
    Plan.objects.create(slug="pro", name="Pro")
    active, _ = ApiKey.create_key(user, "on", raw_key="rk_rows_on")
    inactive, _ = ApiKey.create_key(user, "off", raw_key="rk_rows_off")
    ApiKey.objects.filter(pk=inactive.pk).update(active=False)
    keys = {active.pk, inactive.pk}
    found = by_id(rows_by_id(ApiKey, KEY_FIELDS, keys, active=True))
    assert found == orm_rows(ApiKey, KEY_FIELDS, keys, active=True)
    assert [(row.id, row.active) for row in found] == [(active.pk, True)]  # a bool, converted
    assert [row.id for row in rows_by_id(ApiKey, KEY_FIELDS, keys, active=False)] == \
        [inactive.pk]


def test_with_keys_puts_the_keys_in_ascending_order_in_place_of_the_stand_ins():
    assert with_keys((-1, True, -2, -3, "x", 0), {30, 10, 20}) == (10, True, 20, 30, "x", 0)
    # a query that does not hold one stand-in per key would read other rows: refused
    with pytest.raises(ValueError, match="one stand-in for each of the 2 keys"):
        with_keys((-1, True), {10, 20})
    with pytest.raises(ValueError, match="one stand-in for each of the 1 keys"):
        with_keys(([-1],), {10})
