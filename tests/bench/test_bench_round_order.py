"""The HTTP section's order of runs: every row runs once a round, the runs a ratio divides are
measured side by side, and their order flips from one round to the next."""

from bench.http_throughput import LABELS, ROUND_GROUPS, round_order


def test_every_row_runs_once_a_round():
    for round_number in range(6):
        order = round_order(ROUND_GROUPS, round_number)
        assert sorted(order) == sorted(LABELS)


def test_the_target_ratios_runs_are_side_by_side_in_both_orders():
    pairs = [("none", "ours"), ("none-asgi-async", "ours-asgi-async"),
             ("none-asgi-drf", "ours-asgi-drf")]
    seen = set()
    for round_number in range(12):
        order = round_order(ROUND_GROUPS, round_number)
        for first, second in pairs:
            at = order.index(first)
            assert abs(order.index(second) - at) == 1, (round_number, first)
            seen.add((first, order.index(second) > at))
    # each baseline ran before ours in some rounds and after it in others
    assert seen == {(first, after) for first, _ in pairs for after in (True, False)}


def test_the_groups_take_turns_to_run_first_after_the_flush():
    firsts = {round_order(ROUND_GROUPS, round_number)[0] for round_number in range(6)}
    leading_groups = {next(index for index, group in enumerate(ROUND_GROUPS) if first in group)
                      for first in firsts}
    assert leading_groups == set(range(len(ROUND_GROUPS)))
