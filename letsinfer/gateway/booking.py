"""A finished request, settled and booked: its time and tokens, its key's
charge (which the key's next request must see, so at once), then, once per
turn of the event loop for all that finished in it, its metrics, its request
record and its access-log line (one pass for them all, after their answers
went out)."""

from __future__ import annotations

import asyncio
import time

from letsinfer.gateway import access_log, cache
from letsinfer.gateway.exchange import CLIENT_GONE, Exchange, access_lines, usage_tokens
from letsinfer.gateway.gateway import Gateway
from letsinfer.store.requests import RequestRecord


class Booking:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self._finished: list[Exchange] = []  # settled in this turn of the loop, not booked
        gw.book_now = self._book

    def record(self, ex: Exchange) -> None:
        """Settle a finished request now (its time, tokens and the key's charge,
        which the key's next request must see), and book it (metrics, request
        record, access-log line) with the others that finish in this turn of
        the loop: one pass for them all, after their answers went out."""
        ex.total = time.perf_counter() - ex.started
        if ex.usage is not None:
            prompt_tokens, completion_tokens = ex.usage.prompt_tokens, ex.usage.completion_tokens
        elif ex.tail:
            prompt_tokens, completion_tokens = usage_tokens(ex.tail)
        else:
            prompt_tokens = completion_tokens = None
        cached = ex.cache is cache.HIT
        if cached:  # an answer from the cache costs no tokens
            prompt_tokens = completion_tokens = 0
        ex.tokens = (prompt_tokens, completion_tokens)
        admitted = ex.admitted
        if admitted is not None:
            if cached:
                used = 0
            elif (
                prompt_tokens is None
                and completion_tokens is None
                and ex.pg != "-"
                and (ex.cut_off or ex.status == 200)
            ):
                # An engine worked on it, but its usage never came (the client
                # left, a timeout, a broken stream, a provider that sends none):
                # the estimate, never nothing: the prompt's, and a token per
                # event relayed or four bytes of a whole answer. (An error
                # that came whole reports what it used.)
                made = admitted.events if ex.stream else len(ex.tail) // 4
                used = admitted.charged = admitted.estimate + made
            else:
                used = (prompt_tokens or 0) + (completion_tokens or 0)
            # Not a request of its minute: one refused after its admission (a
            # 429 no engine sent), or whose client left before any engine had
            # it (as the records count). A provider's own 429 reached it: counted.
            counted = ex.pg != "-" or ex.status not in (429, CLIENT_GONE)
            self.gw.limiter.settle(admitted, used, counted)
        elif not cached:
            # Its key got limits while it ran: what it used counts against them.
            self.gw.limiter.charge_late(ex.key, (prompt_tokens or 0) + (completion_tokens or 0))
        shared = ex.project_admitted
        if shared is not None:  # its project's count, charged as its key's is
            if cached:
                used = 0
            elif prompt_tokens is None and completion_tokens is None and ex.pg != "-":
                used = shared.estimate + (shared.events if ex.stream else len(ex.tail) // 4)
            else:
                used = (prompt_tokens or 0) + (completion_tokens or 0)
            counted = ex.pg != "-" or ex.status not in (429, CLIENT_GONE)
            self.gw.limiter.settle(shared, used, counted)
        finished = self._finished
        finished.append(ex)
        if len(finished) == 1:
            asyncio.get_running_loop().call_soon(self._book)

    def _book(self) -> None:
        finished, self._finished = self._finished, []
        if not finished:  # booked early (Gateway.book_now)
            return
        gw = self.gw
        gw.metrics.requests(
            (ex.served, ex.status, ex.total, ex.ttft, ex.key, ex.pg, *ex.tokens) for ex in finished
        )
        records = gw.records
        if records is not None:
            records.add_many(
                RequestRecord(
                    ex.arrived,
                    ex.request_id,
                    ex.key,
                    ex.served if ex.served != "-" else ex.asked[:128],
                    None if ex.pg == "-" else ex.pg,
                    ex.node,
                    ex.endpoint,
                    ex.stream,
                    ex.status,
                    ex.tokens[0],
                    ex.tokens[1],
                    None if ex.ttft is None else ex.ttft * 1000,
                    ex.total * 1000,
                    ex.queue_s * 1000,
                    ex.cache is cache.HIT,
                    None if ex.admitted is None else ex.admitted.charged,
                    ex.tags,
                    None if ex.load_wait is None else ex.load_wait * 1000,
                )
                for ex in finished
                if ex.key != "-"  # refused keys are counted as denials
            )
        access_log.write_many(access_lines(finished))
