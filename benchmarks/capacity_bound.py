"""The fewest loads any policy can make on a request schedule and still serve
enough of it in time: a lower bound, for the capacity benchmark's Zipf mix.

The mix's goal pairs two figures against the baseline: at least 3x fewer
loads and a lower p99 wait. Whether both can hold at once depends on the
schedule, not only on the policy, so this computes what no policy can beat,
not even one that knows every request in advance: the fewest loads with
which a given number of the requests have their model ready within ``W``
seconds of arriving. It is a mixed-integer program solved by HiGHS.

The program is a relaxation of the real problem, so its optimum (and any
bound the solver proves on it) is a lower bound for every real policy:

- Time is in steps of the schedule's interval (requests arrive on steps).
- Answers take no time, and a request is served as soon as its model is
  ready; a real answer only adds to its wait.
- A load takes ``floor(load_s / step)`` steps. It may start on the step its
  GPU's last model is still counted ready and holds the GPU alone only for
  the steps in between, so every real schedule maps onto one of the
  program's with no more loads and no later readiness.
- The GPUs are counted, not named (at most ``gpus`` models ready or loading
  at once), and a model is ready on one GPU or none: a second copy serves
  nothing sooner when answers take no time.

Variables, for each model m and step s: ready[m, s] and start[m, s] (a load
of m begins), both 0 or 1; served[r] for each request r.

- ready[m, s] <= ready[m, s-1] + start[m, s-L]   (ready only if it was, or a load ends)
- sum over m of ready[m, s] + start[m, s-L+1 .. s-1] <= gpus
- served[r] <= sum over s in [t_r, t_r + W] of ready[m_r, s]
- sum of served >= enough;  minimise the sum of start.

The benchmark's seeded schedule is solved in seconds to minutes; a time
limit leaves a proven bound (the solver's dual bound) and the best schedule
found, either of which is reported.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import numpy as np


@dataclass(frozen=True)
class Bound:
    at_least: int  # no policy makes fewer loads (proven)
    found: int | None  # the fewest the solver found a schedule for (None: none)
    feasible: bool = True  # False: no schedule serves that many in time

    @property
    def optimal(self) -> bool:
        return self.found is not None and self.found == self.at_least

    def describe(self) -> str:
        if not self.feasible:
            return "no policy can, whatever its loads"
        if self.optimal:
            return f"{self.at_least} loads, the fewest"
        found = f"; a schedule with {self.found} found" if self.found is not None else ""
        return f"at least {self.at_least} loads (proven{found})"


def fewest_loads(
    requests: Sequence[tuple[int, int]],
    *,
    models: int,
    gpus: int,
    load_steps: int,
    within_steps: int,
    enough: int,
    time_limit_s: float = 120.0,
) -> Bound:
    """The fewest loads with which ``enough`` of ``requests`` ((step, model
    index) each, every model unloaded at step 0) have their model ready at
    most ``within_steps`` after they arrive."""
    if enough > len(requests):
        return Bound(at_least=0, found=None, feasible=False)
    steps = max((t for t, _ in requests), default=0) + within_steps + 1
    n_ready = models * steps

    def ready(m: int, s: int) -> int:
        return m * steps + s

    def start(m: int, s: int) -> int:
        return n_ready + m * steps + s

    n_vars = 2 * n_ready + len(requests)
    rows: list[tuple[list[int], list[float], float, float]] = []
    inf = highspy.kHighsInf
    for s in range(steps):  # the GPUs: ready models and loads under way
        cols = [ready(m, s) for m in range(models)]
        cols += [start(m, s2) for m in range(models) for s2 in range(max(0, s - load_steps + 1), s)]
        rows.append((cols, [1.0] * len(cols), -inf, float(gpus)))
    for m in range(models):  # ready only if it was, or its load ends now
        for s in range(steps):
            cols, vals = [ready(m, s)], [1.0]
            if s > 0:
                cols.append(ready(m, s - 1))
                vals.append(-1.0)
            if s - load_steps >= 0:
                cols.append(start(m, s - load_steps))
                vals.append(-1.0)
            rows.append((cols, vals, -inf, 0.0))
    for r, (t, m) in enumerate(requests):  # served: its model ready in time
        window = range(t, min(steps, t + within_steps + 1))
        cols = [2 * n_ready + r] + [ready(m, s) for s in window]
        rows.append((cols, [1.0] + [-1.0] * len(window), -inf, 0.0))
    served = list(range(2 * n_ready, n_vars))
    rows.append((served, [1.0] * len(served), float(enough), inf))

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("threads", 1)
    cost = np.zeros(n_vars)
    cost[n_ready : 2 * n_ready] = 1.0
    h.addVars(n_vars, np.zeros(n_vars), np.ones(n_vars))
    h.changeColsCost(n_vars, np.arange(n_vars, dtype=np.int32), cost)
    h.changeColsIntegrality(
        n_vars,
        np.arange(n_vars, dtype=np.int32),
        np.array([highspy.HighsVarType.kInteger] * n_vars),
    )
    starts, index, value = [], [], []
    for cols, vals, _, _ in rows:
        starts.append(len(index))
        index += cols
        value += vals
    h.addRows(
        len(rows),
        np.array([r[2] for r in rows]),
        np.array([r[3] for r in rows]),
        len(index),
        np.array(starts, dtype=np.int32),
        np.array(index, dtype=np.int32),
        np.array(value),
    )
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return Bound(at_least=0, found=None, feasible=False)
    info = h.getInfo()
    if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kTimeLimit):
        raise RuntimeError(f"HiGHS stopped without a bound: {h.modelStatusToString(status)}")
    # Loads are whole: a dual bound of 33.2 proves 34 (and HiGHS stops, optimal,
    # within its gap of the schedule it found, which the ceiling then meets).
    at_least = max(0, math.ceil(info.mip_dual_bound - 1e-6))
    found = None
    if info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible:
        found = round(info.objective_function_value)
    return Bound(at_least=at_least, found=found)


def mix_bound(
    schedule: Sequence[str],
    *,
    interval_s: float,
    load_s: float,
    within_s: float,
    gpus: int,
    quantile: float = 0.99,
    time_limit_s: float = 120.0,
) -> Bound:
    """:func:`fewest_loads` for the benchmark's mix: requests one ``interval_s``
    apart, the model each asks for (names), loads of at least ``load_s``, and a
    ``quantile`` wait (as the benchmark ranks its samples) of ``within_s``."""
    names = sorted(set(schedule))
    requests = [(i, names.index(model)) for i, model in enumerate(schedule)]
    # The benchmark's percentile is the sample at round(q * (n - 1)) in order:
    # that one and all below it must wait no longer.
    enough = round(quantile * (len(requests) - 1)) + 1
    return fewest_loads(
        requests,
        models=len(names),
        gpus=gpus,
        load_steps=math.floor(load_s / interval_s + 1e-9),
        within_steps=math.ceil(within_s / interval_s - 1e-9),
        enough=enough,
        time_limit_s=time_limit_s,
    )


def main(argv: list[str] | None = None) -> int:
    from benchmarks.capacity import FULL, GPUS, SHORT, schedule

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="the --short mix (40 s)")
    parser.add_argument(
        "--load-s", type=float, required=True, help="the shortest a load takes (s), e.g. 5"
    )
    parser.add_argument(
        "--p99",
        type=float,
        nargs="+",
        required=True,
        help="p99 waits to bound the loads for (s), e.g. the baseline's",
    )
    parser.add_argument("--time-limit", type=float, default=120.0, help="per bound (s)")
    args = parser.parse_args(argv)
    plan = SHORT if args.short else FULL
    requests = schedule(plan)
    print(
        f"{len(requests)} requests, one every {plan.interval_s:g}s, {GPUS} GPUs, loads of at "
        f"least {args.load_s:g}s; answers taken as instant (a lower bound)",
        flush=True,
    )
    for within in args.p99:
        bound = mix_bound(
            requests,
            interval_s=plan.interval_s,
            load_s=args.load_s,
            within_s=within,
            gpus=GPUS,
            time_limit_s=args.time_limit,
        )
        print(f"p99 wait of {within:g}s or less: {bound.describe()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
