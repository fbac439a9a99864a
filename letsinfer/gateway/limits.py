"""Rate limits and token budgets per API key, counted in memory.

Only keys that carry limits reach this module (the request path checks
``key.limits is not None`` and nothing else). Three counts per such key:

- requests per minute: the arrival times of its admitted requests in the last
  60 seconds; one more than ``rpm`` is refused (429 ``rate_limit_exceeded``)
  with ``Retry-After`` until the oldest leaves the window;
- tokens per minute: prompt + completion tokens, charged when a request ends
  (from its usage, as the request records count them), over the last 60
  seconds; while the window holds ``tpm`` or more the key is refused with
  ``Retry-After`` until enough of it leaves;
- a token budget per calendar period (UTC day, week from Monday, or month):
  once spent, 429 ``budget_exhausted`` with ``Retry-After`` until the period
  ends.

Tokens are known only after a request, so a request admitted under a limit
may end over it; the next one is refused. So that many requests at once
cannot all start on what is left of a budget, each holds an estimate of its
tokens while it runs (its prompt at four bytes a token, plus the most it
lets the model write, when it sets that: ``max_tokens``,
``max_completion_tokens`` or llama.cpp's ``n_predict``, whichever is
largest): a key whose spent and held tokens reach its budget waits for its
requests in progress (429 ``budget_exhausted``, ``Retry-After: 1``), and a
request that sets how much it may write, with an estimate more than what is
left, is refused the same way (one that sets none may pass the budget by what
it writes). A request whose engine never reported its usage (a stream whose client
left, a timeout, a provider that sends none) is charged that estimate of its
prompt and a token per event it relayed (a whole answer: four bytes a
token), never nothing. A request refused after it was
admitted here (the key's concurrency, a full queue) does not count against
the requests per minute, as the records count it after a restart.

The counts survive a gateway restart: :meth:`Limiter.restore` rebuilds them
from the request records (letsinfer.store.requests), which hold every
request's tokens, and the estimate a request was charged instead when it
reported none.
"""

from __future__ import annotations

import collections
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from letsinfer.gateway.errors import GatewayError

WINDOW_S = 60.0


@dataclass(frozen=True)
class KeyLimits:
    rpm: int | None = None
    tpm: int | None = None
    budget: int | None = None  # tokens per period
    period: str | None = None  # day, week or month

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.budget is not None

    def counts_more_than(self, before: KeyLimits) -> bool:
        """Whether these limits need counts that ``before`` did not keep, to be
        read from the request records: a budget's period (its tokens) or a
        request rate (its arrivals). Every limited key's last minute of tokens
        is kept whatever its limits."""
        return (self.period is not None and self.period != before.period) or (
            self.rpm is not None and before.rpm is None
        )


def period_bounds(period: str, now: float) -> tuple[float, float]:
    """The UTC calendar period holding ``now``: (start, end) in epoch seconds."""
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, end = day, day + timedelta(days=1)
    elif period == "week":
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
    elif period == "month":
        start = day.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"unknown budget period {period!r}")
    return start.timestamp(), end.timestamp()


def counted_since(limits: KeyLimits, now: float) -> float:
    """The earliest time whose requests ``limits``' counts hold at ``now``:
    its budget period's start, or a minute ago, whichever is earlier."""
    since = now - WINDOW_S
    if limits.period is not None:
        since = min(since, period_bounds(limits.period, now)[0])
    return since


def _who(key: str) -> str:
    """What a refusal names: the key, or the project whose limits it shares
    (counted as ``project:NAME``, a name no key can have)."""
    scope, _, project = key.partition(":")
    return f"project '{project}'" if project and scope == "project" else f"API key '{key}'"


def _who_first(key: str) -> str:
    """The same, at the start of a sentence."""
    who = _who(key)
    return who[0].upper() + who[1:]


def rate_limited(key: str, what: str, limit: int, retry_after: int) -> GatewayError:
    return GatewayError(
        429,
        f"{_who_first(key)} reached its limit of {limit} {what} per minute; "
        f"retry in {retry_after}s.",
        type_="rate_limit_exceeded",
        code="rate_limit_exceeded",
        headers={"retry-after": str(retry_after)},
    )


def budget_exhausted(key: str, budget: int, period: str, retry_after: int) -> GatewayError:
    return GatewayError(
        429,
        f"{_who_first(key)} has spent its budget of {budget} tokens this {period} (UTC); "
        f"it renews in {retry_after}s.",
        type_="insufficient_quota",
        code="budget_exhausted",
        headers={"retry-after": str(retry_after)},
    )


def budget_held(key: str, budget: int, period: str, spent: int, held: int) -> GatewayError:
    return GatewayError(
        429,
        f"{_who_first(key)} has spent {spent} of its budget of {budget} tokens this {period} "
        f"(UTC) and its requests in progress may use the rest (about {held} tokens); "
        "retry when one finishes.",
        type_="insufficient_quota",
        code="budget_exhausted",
        headers={"retry-after": "1"},
    )


def budget_short(
    key: str, budget: int, period: str, asks: int, left: int, held: int, retry_after: int
) -> GatewayError:
    held_by = f", its requests in progress holding about {held} more" if held else ""
    return GatewayError(
        429,
        f"This request may use about {asks} tokens (its prompt, and the most it lets the "
        f"model write), and {_who(key)} has about {left} left of its budget of "
        f"{budget} tokens this {period} (UTC){held_by}; ask for fewer tokens or retry later.",
        type_="insufficient_quota",
        code="budget_exhausted",
        headers={"retry-after": str(retry_after)},
    )


def beyond_budget(key: str, budget: int, period: str, asks: int) -> GatewayError:
    return GatewayError(
        400,
        f"This request may use about {asks} tokens (its prompt, and the most it lets the "
        f"model write: max_tokens, max_completion_tokens or n_predict), more than "
        f"{_who(key)} may use in a whole {period} ({budget} tokens): ask for fewer tokens.",
        code="invalid_value",
        param="max_tokens",
    )


class Admitted:
    """One request that :meth:`Limiter.admit` counted, until :meth:`Limiter.settle`."""

    __slots__ = ("at", "charged", "estimate", "events", "held", "key", "state")

    def __init__(self, key: str, state: _KeyState, at: float, held: int, estimate: int) -> None:
        self.key = key
        self.state = state  # the counts it was admitted to (a key's limits cleared drop them)
        self.at = at  # its arrival, in the requests-per-minute window
        self.held = held  # tokens held against the budget while it runs
        self.estimate = estimate  # its prompt's tokens, estimated (charged if it reports none)
        self.events = 0  # stream events relayed so far (a token each, if it reports none)
        self.charged: int | None = None  # what it was charged, when that was an estimate


def estimate_prompt(body: bytes) -> int:
    """A request's prompt tokens before any engine counted them: about four
    bytes a token (the JSON around the text makes it a little high)."""
    return len(body) // 4 + 1


class _KeyState:
    __slots__ = (
        "generation",
        "held",
        "in_window",
        "period",
        "period_start",
        "requests",
        "running",
        "spent",
        "tokens",
    )

    def __init__(self) -> None:
        self.requests: collections.deque[float] = collections.deque()
        self.tokens: collections.deque[tuple[float, int]] = collections.deque()
        self.in_window = 0  # the sum of self.tokens
        self.period: str | None = None  # its budget's, as last set
        self.period_start: float | None = None
        self.spent = 0  # tokens since period_start
        self.held = 0  # estimated tokens of its requests in progress
        # The arrivals of its requests in progress (how many at each): no
        # record has them yet, so a recount from the records keeps them.
        self.running: dict[float, int] = {}
        self.generation = 0  # its last recount's number: a read begun before it is stale


class Limiter:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock  # wall clock: the records it restores from carry wall time
        self._keys: dict[str, _KeyState] = {}
        self._recounts = 0  # one sequence for all keys: a key forgotten and counted again
        # must not take up a number a read still in progress carries

    def _state(self, key: str) -> _KeyState:
        st = self._keys.get(key)
        if st is None:
            st = self._keys[key] = _KeyState()
        return st

    @staticmethod
    def _expire(st: _KeyState, now: float) -> None:
        horizon = now - WINDOW_S
        while st.requests and st.requests[0] <= horizon:
            st.requests.popleft()
        while st.tokens and st.tokens[0][0] <= horizon:
            st.in_window -= st.tokens.popleft()[1]

    @staticmethod
    def _roll(st: _KeyState, period: str, now: float) -> float:
        """Start a new budget period when ``now`` left the counted one; its end."""
        start, end = period_bounds(period, now)
        if st.period_start != start:
            st.period_start, st.spent = start, 0
        return end

    def admit(
        self, key: str, limits: KeyLimits, prompt: int = 0, max_tokens: int | None = None
    ) -> Admitted:
        """Count a request against its key's limits, or refuse it (429);
        ``prompt``: its prompt's tokens, estimated; ``max_tokens``: the most it
        asked for. Settle what it returns with :meth:`settle` when it ends."""
        now = self.clock()
        st = self._state(key)
        st.period = limits.period
        self._expire(st, now)
        if limits.budget is not None and limits.period is not None:
            end = self._roll(st, limits.period, now)
            if st.spent >= limits.budget:
                raise budget_exhausted(
                    key, limits.budget, limits.period, max(1, math.ceil(end - now))
                )
            if st.spent + st.held >= limits.budget:
                raise budget_held(key, limits.budget, limits.period, st.spent, st.held)
            # A request that says how much it may write must fit in what is
            # left; one that does not may pass the budget by what it writes.
            asks = prompt + max_tokens if max_tokens is not None else 0
            if asks > limits.budget:  # no wait would help: refused as the request it is
                raise beyond_budget(key, limits.budget, limits.period, asks)
            if st.spent + st.held + asks > limits.budget:
                left = limits.budget - st.spent - st.held
                retry_after = 1 if st.held else max(1, math.ceil(end - now))
                raise budget_short(
                    key, limits.budget, limits.period, asks, left, st.held, retry_after
                )
        if limits.tpm is not None and st.in_window >= limits.tpm:
            # Until enough of the window's tokens leave it to fall under the limit.
            left, wait = st.in_window, WINDOW_S
            for at, tokens in st.tokens:
                left -= tokens
                if left < limits.tpm:
                    wait = at + WINDOW_S - now
                    break
            raise rate_limited(key, "tokens", limits.tpm, max(1, math.ceil(wait)))
        if limits.rpm is not None:
            if len(st.requests) >= limits.rpm:
                wait = st.requests[-limits.rpm] + WINDOW_S - now
                raise rate_limited(key, "requests", limits.rpm, max(1, math.ceil(wait)))
            st.requests.append(now)
        held = prompt + (max_tokens or 0) if limits.budget is not None else 0
        st.held += held
        st.running[now] = st.running.get(now, 0) + 1
        return Admitted(key, st, now, held, prompt)

    def settle(self, admitted: Admitted, tokens: int, counted: bool = True) -> None:
        """An admitted request ended having used ``tokens`` (prompt + completion);
        ``counted``: false when it was refused after its admission (it leaves
        the requests-per-minute window)."""
        st = self._keys.get(admitted.key)
        if st is None:  # its key has no limits now: nothing of it is counted
            return
        if st is admitted.state:
            st.held = max(0, st.held - admitted.held)
            left = st.running.pop(admitted.at, 0) - 1
            if left > 0:
                st.running[admitted.at] = left
            if not counted:
                with contextlib.suppress(ValueError):
                    st.requests.remove(admitted.at)
        # (Else its key's limits were cleared and set again while it ran: its
        # hold and arrival went with the old counts, its tokens count in the new.)
        self._charge(st, tokens)

    def charge_late(self, key: str, tokens: int) -> None:
        """A request admitted while its key had no limits ended after the key's
        counting began: no record read for that count has it, so it is charged
        here (nothing, when the key is not counted)."""
        st = self._keys.get(key)
        if st is not None:
            self._charge(st, tokens)

    def _charge(self, st: _KeyState, tokens: int) -> None:
        if tokens <= 0:
            return
        now = self.clock()
        st.tokens.append((now, tokens))
        st.in_window += tokens
        period = st.period  # (the key's budget may have changed while it ran)
        if period is not None:
            self._roll(st, period, now)
            st.spent += tokens

    def exhausted(self, key: str, limits: KeyLimits) -> float | None:
        """The start of the budget period ``key`` has spent all of (as counted
        so far), or None: not spent, no budget, or a new period begun."""
        st = self._keys.get(key)
        if st is None or limits.budget is None or limits.period is None:
            return None
        if st.period_start != period_bounds(limits.period, self.clock())[0]:
            return None
        return st.period_start if st.spent >= limits.budget else None

    def spent(self, key: str) -> int:
        st = self._keys.get(key)
        return st.spent if st is not None else 0

    def forget(self, key: str) -> None:
        """A key without limits now: nothing of it is counted."""
        self._keys.pop(key, None)

    def recount(self, key: str, limits: KeyLimits) -> int:
        """Begin counting a key afresh from the request records: what they hold
        (every request that ended and was booked until now) is dropped here, to
        be added back by :meth:`restore` with the number this returns. Its
        requests in progress are in no record: they keep their arrivals and
        their budget holds, and are charged here when they end."""
        st = self._state(key)
        self._recounts += 1
        st.generation = self._recounts
        st.period = limits.period
        st.tokens.clear()
        st.in_window = st.spent = 0
        st.period_start = None
        st.requests = collections.deque(
            sorted(at for at, n in st.running.items() for _ in range(n))
        )
        return st.generation

    @staticmethod
    def period_start(limits: KeyLimits, now: float) -> float | None:
        return period_bounds(limits.period, now)[0] if limits.period is not None else None

    def restore(
        self,
        key: str,
        limits: KeyLimits,
        spent: int,
        recent: Sequence[tuple[float, float, int, bool]],
        generation: int,
        period_start: float | None,
    ) -> None:
        """Add what the request records say a key did before the recount
        ``generation`` began: ``spent`` tokens in its budget period, and its
        requests that ended in the last minute as (arrival time, end time,
        tokens, counted as a request): arrivals count for the requests per
        minute, tokens at their end, as :meth:`admit` and :meth:`settle` count
        them. A read begun before a later recount is dropped: the later one
        reads all it held. ``period_start``: the start of the period ``spent``
        was read for (:meth:`period_start`); one that ended during the read
        leaves it out."""
        now = self.clock()
        st = self._keys.get(key)
        if st is None or st.generation != generation:
            return  # (a recount sets the period it counts: that of ``limits``)
        if limits.period is not None:
            self._roll(st, limits.period, now)
            if period_start == st.period_start:
                st.spent += spent
        horizon = now - WINDOW_S
        tokens = [(ended, n) for _, ended, n, _ in recent if n and ended > horizon]
        arrivals = [at for at, _, _, counted in recent if counted and at > horizon]
        st.tokens = collections.deque(sorted([*tokens, *st.tokens]))
        st.in_window = sum(n for _, n in st.tokens)
        st.requests = collections.deque(sorted([*arrivals, *st.requests]))
