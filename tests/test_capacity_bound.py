"""The capacity benchmark's lower bound on loads (benchmarks/capacity_bound.py):
its program, on schedules small enough to count by hand."""

from __future__ import annotations

from benchmarks.capacity_bound import fewest_loads, mix_bound


def loads(requests, *, gpus=2, within=5, enough=None, models=3):
    return fewest_loads(
        requests,
        models=models,
        gpus=gpus,
        load_steps=5,
        within_steps=within,
        enough=len(requests) if enough is None else enough,
    )


def test_the_gpus_limit_how_many_models_are_ready_in_time():
    three_at_once = [(0, 0), (0, 1), (0, 2)]
    # Two GPUs load two models by step 5; the third can only start as one is done.
    assert not loads(three_at_once, within=5).feasible
    assert loads(three_at_once, within=5, enough=2).at_least == 2
    bound = loads(three_at_once, within=10)
    assert (bound.at_least, bound.found, bound.optimal) == (3, 3, True)


def test_a_model_asked_for_again_after_another_took_its_gpu_is_loaded_again():
    back_and_forth = [(0, 0), (10, 1), (20, 0)]
    assert loads(back_and_forth, gpus=1).at_least == 3
    assert loads(back_and_forth, gpus=2).at_least == 2  # each keeps its own GPU


def test_requests_waiting_for_one_model_share_its_load():
    assert loads([(0, 0), (1, 0), (2, 0), (3, 0)], gpus=1).at_least == 1


def test_a_longer_wait_allowed_needs_no_more_loads():
    schedule = [(t, t % 3) for t in range(30)]
    # Within 40 steps the third model can wait for a GPU until the others are
    # done: each model loaded once. Within 15 the models must take turns.
    tight, loose = loads(schedule, within=15), loads(schedule, within=40)
    assert loose.at_least == 3
    assert tight.feasible and tight.at_least > loose.at_least
    # Within 6, a turn (5 steps of load) leaves the model it displaced late.
    assert not loads(schedule, within=6).feasible


def test_the_mix_counts_the_p99_as_the_benchmark_ranks_its_waits():
    # 100 requests: the benchmark's p99 is the 99th smallest wait, so one may
    # be late. The one request for "rare" is that one, and is not loaded for.
    schedule = ["popular"] * 50 + ["rare"] + ["popular"] * 49
    bound = mix_bound(schedule, interval_s=1.0, load_s=5.5, within_s=10.0, gpus=1)
    assert (bound.at_least, bound.optimal) == (1, True)
    # At p100 (every request in time) it must be loaded too, and the popular
    # model again after it: three loads.
    every = mix_bound(schedule, interval_s=1.0, load_s=5.5, within_s=10.0, gpus=1, quantile=1.0)
    assert every.at_least == 3


def test_the_mix_rounds_time_in_the_policy_s_favour():
    # Steps of 2 s: an 11 s load takes 5 steps (not 6) and a 9 s wait is 5
    # steps (not 4), so a load that ends just after the wait still counts as
    # in time, and the bound never exceeds what a real policy needs.
    bound = mix_bound(["a"], interval_s=2.0, load_s=11.0, within_s=9.0, gpus=1)
    assert bound.feasible and bound.at_least == 1
    assert not mix_bound(["a"], interval_s=2.0, load_s=11.0, within_s=7.9, gpus=1).feasible
