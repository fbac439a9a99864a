"""letsinfer's gateway alone, in front of given engine URLs, as the benchmarks run it.

``python -m benchmarks.letsinfer_gateway --port P --upstream URL [--upstream URL ...]``
creates a throwaway authority (one model ``mock``, one API key written to
``--key-file``), publishes each upstream as a ready replica and serves the
gateway the way ``letsinfer up`` does (uvicorn, uvloop, httptools, its
guarded listener, access log to a file). ``--records DB`` keeps request
records as a main does; ``--facts`` feeds every replica fresh facts once a
second, as a main does from its nodes' reports, so the replica choice weighs
them. ``--breadth`` configures everything the gateway can add to a request
(issue 16, items 1-5) without the benchmark's key using any of it: an
external model as the fallback of ``mock``, a LoRA adapter loaded on every
replica, other keys with a band, rate limits, a budget and a response cache;
the benchmark's key has an allowlist (``mock`` and its adapter).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from letsinfer.authority.apikeys import create_key
from letsinfer.authority.external import add_external_model, set_fallback
from letsinfer.config import GatewaySettings, RequestSettings
from letsinfer.connections import GuardedServer, gateway_limits, raise_file_limit
from letsinfer.gateway.app import Gateway, create_app
from letsinfer.gateway.directory import Directory
from letsinfer.gateway.routing import Replica, ReplicaFacts, RoutingTable
from letsinfer.store import AuthorityStore
from letsinfer.usage.recorder import RequestLog


async def feed_facts(routing: RoutingTable, model: str, capacity: int) -> None:
    while True:
        for r in routing.replicas(model):
            routing.observe(model, r.pg_id, ReplicaFacts(time.monotonic(), capacity, 0, 60.0))
        await asyncio.sleep(1.0)


def configure_breadth(store: AuthorityStore, model: str, home: Path) -> tuple[str, ...]:
    """Items 1-5 of issue 16 configured, none of them on the benchmark key's path;
    returns the adapters every replica has loaded."""
    provider_key = home / "provider.key"
    provider_key.write_text("sk-never-sent\n")
    provider_key.chmod(0o600)
    # Port 9 (discard): never reached, since the model's own groups answer.
    add_external_model(store, "provider", "http://127.0.0.1:9/v1", "their-model", provider_key)
    set_fallback(store, model, "provider")
    store.add_adapter(f"{model}-lora", model, "1" * 64, 1, None)
    create_key(store, "batch", policy={"band": "batch"})
    create_key(
        store,
        "limited",
        policy={"rpm": 600, "tpm": 100_000, "budget_tokens": 1_000_000, "budget_period": "day"},
    )
    create_key(store, "cached", policy={"cache_ttl_s": 60})
    return (f"{model}-lora",)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", action="append", required=True)
    parser.add_argument("--model", default="mock")
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--upstream-key", default="", help="Authorization sent to engines")
    parser.add_argument("--affinity-chars", type=int, default=256, help="0 turns affinity off")
    parser.add_argument("--home", type=Path, required=True, help="for the throwaway authority")
    parser.add_argument("--key-file", type=Path, required=True)
    parser.add_argument("--access-log", type=Path, required=True)
    parser.add_argument("--records", type=Path, help="keep request records in this database")
    parser.add_argument("--facts", action="store_true", help="feed replicas fresh facts")
    parser.add_argument(
        "--breadth", action="store_true", help="configure fallbacks, adapters, limits, cache"
    )
    return parser


@dataclass
class Bench:
    """A gateway set up as the arguments say, not yet serving."""

    gateway: Gateway
    routing: RoutingTable
    records: RequestLog | None
    settings: GatewaySettings

    def start_background(self, args: argparse.Namespace) -> list[asyncio.Task[None]]:
        """What a main runs beside its gateway: the records writer, nodes' facts."""
        tasks = []
        if self.records is not None:
            tasks.append(asyncio.create_task(self.records.run()))
        if args.facts:
            tasks.append(asyncio.create_task(feed_facts(self.routing, args.model, args.capacity)))
        return tasks


def set_up(args: argparse.Namespace) -> Bench:
    """A throwaway authority with one model and the benchmark's key, and a
    gateway with each upstream published as a ready replica."""
    store = AuthorityStore(args.home / "authority.db")
    store.add_service(args.model, "0" * 64, 0, "gguf", None)
    adapters: tuple[str, ...] = ()
    if args.breadth:
        adapters = configure_breadth(store, args.model, args.home)
        allowed: tuple[str, ...] = (args.model, *adapters)
        args.key_file.write_text(create_key(store, "bench", allowed).secret)
    else:
        args.key_file.write_text(create_key(store, "bench").secret)

    handler = logging.FileHandler(args.access_log)
    access = logging.getLogger("letsinfer.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False

    settings = GatewaySettings(
        host="127.0.0.1", port=args.port, metrics_port=0, affinity_prefix_chars=args.affinity_chars
    )
    routing = RoutingTable()
    directory = Directory(store, max_stale_s=3600)  # no refresh loop here: nothing changes
    directory.refresh()
    records = RequestLog(args.records, RequestSettings()) if args.records else None
    gateway = Gateway.build(directory, routing, settings, records=records)
    for i, url in enumerate(args.upstream):
        routing.publish(
            Replica(
                pg_id=f"pg-{i}",
                service=args.model,
                base_url=url,
                authorization=f"Bearer {args.upstream_key}" if args.upstream_key else "",
                capacity=args.capacity,
                adapters=adapters,
            )
        )
    return Bench(gateway, routing, records, settings)


def main() -> None:
    args = arguments().parse_args()
    bench = set_up(args)
    gateway, settings = bench.gateway, bench.settings
    limits = gateway_limits(
        settings.max_connections,
        settings.max_connections_per_client,
        settings.header_timeout_s,
        settings.idle_timeout_s,
        raise_file_limit(),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await gateway.restore_usage()  # the limited keys' counts, as a node does
        tasks = bench.start_background(args)
        try:  # as a main does once started (letsinfer/node.py)
            from letsinfer.heap import settle_after_startup

            settle_after_startup()
        except ImportError:  # a checkout from before (the benchmark's --before)
            pass
        yield
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = create_app(gateway, lifespan=lifespan)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False
    )
    try:  # as a main serves (letsinfer/cli/up.py)
        from letsinfer.gateway.app import direct_path

        config.http = "httptools"
        server = GuardedServer(
            config, limits, name="gateway", batch_writes=True, protocol_mixins=direct_path(app)
        )
    except ImportError:  # a checkout from before (the benchmark's --before)
        try:
            server = GuardedServer(config, limits, name="gateway", batch_writes=True)
        except TypeError:  # from before batched writes
            server = GuardedServer(config, limits, name="gateway")
    server.run()


if __name__ == "__main__":
    main()
