"""The HTTP section's cost of the ASGI floor: what ours' one take.lua call costs in CPU per
request over no throttle (medians of the rounds), and the part of it that was Redis's."""

import math

from bench.http_throughput import floor_cost


def test_the_floors_cost_is_the_difference_of_the_medians_and_their_ratio():
    cpu = {"none": [2000.0, 2100.0, 2200.0], "take": [2300.0, 2310.0, 2280.0]}
    redis_cpu = {"none": [2.0, 1.0, 3.0], "take": [55.0, 60.0, 50.0]}
    cost = floor_cost(cpu, redis_cpu, "take", "none")
    assert cost["none_us"] == 2100.0
    assert cost["added_us"] == 200.0
    assert cost["redis_added_us"] == 53.0
    assert math.isclose(cost["cpu_vs_none"], 2300.0 / 2100.0)


def test_a_floor_cheaper_than_no_throttle_reads_below_one():
    # noise can put the floor's median under no throttle's: the figure says so, not 1.0
    cost = floor_cost({"none": [1000.0], "take": [990.0]}, {"none": [0.0], "take": [40.0]},
                      "take", "none")
    assert cost["added_us"] == -10.0
    assert cost["cpu_vs_none"] < 1.0


def test_no_cpu_measured_for_no_throttle_gives_infinity_not_a_division_error():
    cost = floor_cost({"none": [0.0], "take": [5.0]}, {"none": [0.0], "take": [0.0]},
                      "take", "none")
    assert cost["cpu_vs_none"] == math.inf
