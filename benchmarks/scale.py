"""One main, many nodes: what a main costs as its cluster grows, and whether
its gateway feels it.

    python -m benchmarks.scale                      # 100, 1,000 and 3,000 nodes (~15 min)
    python -m benchmarks.scale --nodes 100,300 --measure 30
    ./dev bench --scale

A real main (``letsinfer up`` on a throwaway home, its embedded tiny model
serving) and simulated children, all on this machine:

- each child is enrolled through the main's own enrollment: an offer opened
  in the main's authority as ``letsinfer node add`` opens it (the network leg
  to the candidate is skipped: the benchmark plays the candidate), then the
  candidate's CSR sent to the main's ``/v1/enroll/complete`` over TLS, which
  issues its certificate;
- each child reports as an agent does: ``Facts`` (4 fake GPUs, a signed audit
  head) signed with its own key, through ``ClusterClient`` (its kept-alive
  connection, TLS resumption) to ``/v1/agent/facts``, at the real 5 s
  heartbeat, paced like the agent (agent/pacing.py: Retry-After and jittered
  backoff). Children run in a few worker processes, started at random moments
  within one interval.

For each size it prints the main's CPU (its process, percent of one core),
report latency (p50, p99, as the children see it), the answers (200, 503 shed,
timeouts and other errors), the nodes ``node list`` would show unreachable,
and chat latency through the gateway (one request after another to the tiny
model) against the same chat on the idle main measured first. After the
largest size the load drops to the first size and the benchmark waits for
the main to take every report again (no 503, no error): "recovered".

Every child comes from 127.0.0.1, so the main's per-source connection cap is
raised for this run (``LETSINFER_CONTROL__MAX_CONNECTIONS_PER_CLIENT``); on a
real network each node is its own source.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx

from benchmarks.processes import Server, cpu_seconds, free_port

INTERVAL_S = 5.0
STALE_AFTER_S = 20.0  # the main's default node_stale_after_s
OUTCOMES = ("ok", "shed", "timeout", "error", "refused")


# -- the main -------------------------------------------------------------------
@dataclass
class Main:
    home: Path
    server: Server
    control_port: int
    metrics_port: int
    key: str

    @property
    def pid(self) -> int:
        assert self.server.proc is not None
        return self.server.proc.pid

    def identity(self) -> dict[str, Any]:
        return json.loads((self.home / "etc/node.json").read_text())  # type: ignore[no-any-return]

    def ca(self) -> Path:
        from letsinfer.home import Home

        return Home.under(self.home).cluster_dir(self.identity()["cluster"]) / "ca.crt"

    def cpu_seconds(self) -> float:
        """The main's own process (what docs/benchmarks.md reports), not its group."""
        return cpu_seconds([self.pid])


def start_main(root: Path) -> Main:
    home = root / "main"
    port, control, agent, metrics = free_port(), free_port(), free_port(), free_port()
    env = {
        "PYTHONUNBUFFERED": "1",
        "LETSINFER_GATEWAY__HOST": "127.0.0.1",
        "LETSINFER_GATEWAY__PORT": str(port),
        "LETSINFER_GATEWAY__METRICS_PORT": str(metrics),
        "LETSINFER_CONTROL__HOST": "127.0.0.1",
        "LETSINFER_CONTROL__PORT": str(control),
        "LETSINFER_AGENT__API_HOST": "127.0.0.1",
        "LETSINFER_AGENT__API_PORT": str(agent),
        "LETSINFER_DISCOVERY__ENABLED": "false",
        "LETSINFER_REQUESTS__ENABLED": "false",
        # every simulated child connects from 127.0.0.1
        "LETSINFER_CONTROL__MAX_CONNECTIONS_PER_CLIENT": "100000",
    }
    argv = [sys.executable, "-m", "letsinfer", "--home", str(home), "up", "--name", "main"]
    server = Server("main", argv, port, root, env=env, ready_path="/health")
    server.start(timeout=180)
    text = server.log_path.read_text()
    # Its output goes to a file here, so the banner names the key's file instead.
    found = re.search(r"API key\s+(li-\S+)", text)
    in_file = re.search(r"API key\s+in (\S+)", text)
    if found is not None:
        key = found.group(1)
    elif in_file is not None:
        key = Path(in_file.group(1)).read_text().strip()
    else:
        server.stop()
        raise RuntimeError(f"no API key in the main's banner: {server.tail()}")
    return Main(home, server, control, metrics, key)


# -- enrollment through the main's own code path ------------------------------------
def enroll(main: Main, root: Path, start: int, count: int) -> list[dict[str, str]]:
    """``count`` new children: an offer each in the main's authority (what
    ``node add`` writes), then each candidate's CSR to ``/v1/enroll/complete``."""
    from letsinfer.audit.anchor import open_authority
    from letsinfer.authority import enrollment
    from letsinfer.home import Home
    from letsinfer.trust import pki

    out_dir = root / "children"
    out_dir.mkdir(exist_ok=True)
    made = []
    store = open_authority(Home.under(main.home))
    try:
        with store.transaction():  # one commit for all the offers
            for i in range(start, start + count):
                key = pki.new_key()
                node_id = uuid.uuid4().hex
                offer = enrollment.open_offer(
                    store,
                    node_id,
                    f"sim-{i:05d}",
                    f"127.0.0.1:{20000 + i}",
                    pki.public_key_fingerprint(key.public_key()),
                    3600,
                )
                key_path = out_dir / f"{node_id}.key"
                pki.write_private_key(key_path, key)
                made.append(
                    {
                        "id": node_id,
                        "name": f"sim-{i:05d}",
                        "key": str(key_path),
                        "cert": str(out_dir / f"{node_id}.crt"),
                        "enrollment": offer.record.id,
                        "token": offer.token,
                    }
                )
    finally:
        store.close()

    async def complete() -> None:
        ctx = httpx.create_ssl_context(verify=str(main.ca()))
        ctx.check_hostname = False
        limits = httpx.Limits(max_connections=8)
        async with httpx.AsyncClient(verify=ctx, timeout=60, limits=limits) as client:
            gate = asyncio.Semaphore(8)

            async def one(child: dict[str, str]) -> None:
                key = pki.read_private_key(Path(child["key"]))
                async with gate:
                    r = await client.post(
                        f"https://127.0.0.1:{main.control_port}/v1/enroll/complete",
                        json={
                            "enrollment_id": child.pop("enrollment"),
                            "token": child.pop("token"),
                            "csr": pki.make_csr(key, child["id"]).decode(),
                            "agent_address": f"127.0.0.1:{20000 + int(child['name'][4:])}",
                        },
                    )
                r.raise_for_status()
                Path(child["cert"]).write_text(r.json()["certificate"])

            await asyncio.gather(*(one(c) for c in made))

    asyncio.run(complete())
    return made


# -- simulated children ---------------------------------------------------------------
def _facts_gpus(node_id: str) -> list[Any]:
    from letsinfer.contracts.facts import GpuFact

    rnd = random.Random(node_id)
    return [
        GpuFact(
            uuid=f"GPU-{node_id[:12]}-{i}",
            name="Fake H100 80GB HBM3",
            memory_total=80 << 30,
            memory_free=rnd.randrange(1 << 30, 80 << 30),
            temperature_c=rnd.randrange(35, 75),
            power_w=round(rnd.uniform(80, 650), 1),
            utilization=rnd.randrange(0, 100),
        )
        for i in range(4)
    ]


async def _child(
    child: dict[str, str], cfg: dict[str, Any], events: list[tuple[float, float, str]]
) -> None:
    from letsinfer import __version__
    from letsinfer.agent.pacing import ReportPacing, keepalive_s, retry_after
    from letsinfer.audit.anchor import sign_head
    from letsinfer.contracts.facts import AuditHeadFact, Facts, sign
    from letsinfer.trust import pki
    from letsinfer.trust.client import ClusterClient, PeerMismatch
    from letsinfer.trust.material import TlsFiles

    files = TlsFiles(cert=Path(child["cert"]), key=Path(child["key"]), ca=Path(cfg["ca"]))
    client = ClusterClient(files, expect_node=cfg["main_id"], keepalive_s=keepalive_s(INTERVAL_S))
    key = pki.read_private_key(files.key)
    head = sign_head(key, 7, hashlib.sha256(child["id"].encode()).hexdigest())
    audit = AuditHeadFact(count=head.count, hash=head.hash, signature=head.signature)
    gpus = _facts_gpus(child["id"])
    pacing = ReportPacing(INTERVAL_S)
    url = f"https://127.0.0.1:{cfg['control_port']}/v1/agent/facts"
    seq = 0
    await asyncio.sleep(random.uniform(0, INTERVAL_S))  # nodes do not start in step
    try:
        while True:
            seq = max(seq + 1, int(time.time() * 1000))
            facts = Facts(
                node_id=child["id"],
                seq=seq,
                ts=time.time(),
                cpus=64,
                memory_bytes=512 << 30,
                memory_available=400 << 30,
                targets=["cpu", "cuda"],
                gpus=gpus,
                version=__version__,
                audit=audit,
                firewall=True,
            )
            envelope = sign(facts, key)
            started = time.perf_counter()
            try:
                resp = await client.arequest("POST", url, json=envelope)
            except httpx.TimeoutException:
                outcome, wait = "timeout", pacing.failed()
            except (httpx.HTTPError, OSError, PeerMismatch):
                outcome, wait = "error", pacing.failed()
            else:
                if resp.status_code == 200:
                    outcome, wait = "ok", pacing.answered()
                elif resp.status_code == 503:
                    outcome, wait = "shed", pacing.busy(retry_after(resp))
                else:
                    outcome, wait = "refused", pacing.refused()
            events.append((time.time(), time.perf_counter() - started, outcome))
            await asyncio.sleep(wait)
    finally:
        await client.aclose()


def _summary(events: list[tuple[float, float, str]], t0: float, t1: float) -> dict[str, Any]:
    inside = [e for e in events if t0 <= e[0] < t1]
    counts = {o: 0 for o in OUTCOMES}
    for e in inside:
        counts[e[2]] += 1
    return {"counts": counts, "ok_latency": [e[1] for e in inside if e[2] == "ok"]}


def worker(
    children: list[dict[str, str]], cfg: dict[str, Any], stop: Event, pipe: Connection
) -> None:
    """A process simulating ``children``; answers ``(t0, t1)`` with a summary."""

    async def run() -> None:
        events: list[tuple[float, float, str]] = []
        tasks = [asyncio.create_task(_child(c, cfg, events)) for c in children]
        while not stop.is_set():
            await asyncio.sleep(0.2)
            try:
                while pipe.poll():
                    t0, t1 = pipe.recv()
                    pipe.send(_summary(events, t0, t1))
            except (EOFError, OSError):  # the benchmark is gone
                break
            cutoff = time.time() - 600
            if events and events[0][0] < cutoff:
                events[:] = [e for e in events if e[0] >= cutoff]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())


@dataclass
class Fleet:
    """Worker processes, each simulating a slice of the children."""

    cfg: dict[str, Any]
    workers: list[tuple[mp.process.BaseProcess, Event, Connection, int]] = field(
        default_factory=list
    )

    def cpu_seconds(self) -> float:
        """CPU the simulated children used so far (the workers running now)."""
        return cpu_seconds(proc.pid for proc, _, _, _ in self.workers if proc.pid)

    def start(self, children: list[dict[str, str]], per_worker: int = 300) -> None:
        ctx = mp.get_context("spawn")
        for i in range(0, len(children), per_worker):
            part = children[i : i + per_worker]
            stop = ctx.Event()
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker, args=(part, self.cfg, stop, theirs), daemon=True)
            proc.start()
            self.workers.append((proc, stop, ours, len(part)))

    @property
    def size(self) -> int:
        return sum(w[3] for w in self.workers)

    def stop(self, keep: int = 0) -> None:
        """Stop workers until at most ``keep`` children remain."""
        while self.workers and self.size > keep:
            proc, stop, _, _ = self.workers.pop()
            stop.set()
            proc.join(30)
            if proc.is_alive():
                proc.kill()

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        counts = {o: 0 for o in OUTCOMES}
        latency: list[float] = []
        for _, _, pipe, _ in self.workers:
            pipe.send((t0, t1))
        for _, _, pipe, _ in self.workers:
            part = pipe.recv()
            for o, n in part["counts"].items():
                counts[o] += n
            latency.extend(part["ok_latency"])
        return {"counts": counts, "latency": latency}


# -- what the operator sees --------------------------------------------------------
def stale_nodes(main: Main, ids: list[str]) -> int:
    """Of these children, how many ``node list`` shows unreachable now."""
    with contextlib.closing(sqlite3.connect(main.home / "var/authority.db", timeout=30)) as db:
        rows = db.execute("SELECT id, last_seen FROM nodes WHERE role = 'child'").fetchall()
    seen = dict(rows)
    now = time.time()
    return sum(1 for i in ids if seen.get(i) is None or now - seen[i] >= STALE_AFTER_S)


def metrics(main: Main) -> dict[str, float]:
    r = httpx.get(f"http://127.0.0.1:{main.metrics_port}/metrics", timeout=30)
    out: dict[str, float] = {}
    for line in r.text.splitlines():
        for name in (
            "letsinfer_control_reports_total",
            "letsinfer_control_reports_shed_total",
            "letsinfer_control_shed_ratio",
        ):
            if line.startswith(name + " "):
                out[name] = float(line.split()[1])
    return out


@contextlib.contextmanager
def chatting(main: Main, pause_s: float = 0.2) -> Iterator[list[float]]:
    """Chat requests through the gateway, one after another, while the block
    runs; the list holds each one's seconds (a failure counts as inf)."""
    took: list[float] = []
    done = threading.Event()

    def run() -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        headers = {"authorization": f"Bearer {main.key}"}
        with httpx.Client(base_url=main.server.url, timeout=30, headers=headers) as client:
            while not done.is_set():
                started = time.perf_counter()
                try:
                    ok = client.post("/v1/chat/completions", json=body).status_code == 200
                except httpx.HTTPError:
                    ok = False
                took.append(time.perf_counter() - started if ok else float("inf"))
                done.wait(pause_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield took
    finally:
        done.set()
        thread.join(60)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def ms(x: float) -> str:
    return "–" if x != x else ("fail" if x == float("inf") else f"{x * 1000:.0f}")


# -- the run ----------------------------------------------------------------------------
def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure_idle(main: Main, seconds: float) -> dict[str, Any]:
    cpu0, t0 = main.cpu_seconds(), time.monotonic()
    with chatting(main) as took:
        time.sleep(seconds)
    cpu = (main.cpu_seconds() - cpu0) / (time.monotonic() - t0)
    return {"nodes": 0, "cpu": cpu, "chat": took}


def measure(
    main: Main, fleet: Fleet, ids: list[str], warm_s: float, seconds: float
) -> dict[str, Any]:
    time.sleep(warm_s)
    stale_max = 0
    cpu0, sim0, t0, wall0 = main.cpu_seconds(), fleet.cpu_seconds(), time.monotonic(), time.time()
    with chatting(main) as took:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(min(5.0, max(0.0, end - time.monotonic())))
            stale_max = max(stale_max, stale_nodes(main, ids))
    took_s = time.monotonic() - t0
    cpu = (main.cpu_seconds() - cpu0) / took_s
    sim = (fleet.cpu_seconds() - sim0) / took_s
    seen = fleet.summary(wall0, time.time())
    return {
        "nodes": len(ids),
        "cpu": cpu,
        "simulator_cpu": sim,
        "chat": took,
        "reports": seen["counts"],
        "latency": seen["latency"],
        "stale": stale_max,
        "load": load_average(),
    }


def recover(main: Main, fleet: Fleet, ids: list[str], limit_s: float = 120.0) -> float | None:
    """Seconds until every remaining child's reports are taken (10 s without
    a 503 or an error, and the main no longer shedding); None: not within the limit."""
    dropped = time.monotonic()
    while time.monotonic() - dropped < limit_s:
        time.sleep(2.0)
        now = time.time()
        window = fleet.summary(now - 10, now)["counts"]
        calm = window["ok"] > 0 and not any(window[o] for o in OUTCOMES if o != "ok")
        if calm and metrics(main).get("letsinfer_control_shed_ratio", 0.0) == 0.0:
            return max(0.0, time.monotonic() - dropped - 10)
    return None


def report_rows(idle: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    idle_p50 = statistics.median(idle["chat"]) if idle["chat"] else float("nan")
    print()
    print(
        "| nodes | main CPU (% of a core) | simulator CPU | report p50 / p99 (ms) | 200 | 503 "
        "| timeouts | errors | shown stale | chat p50 / p99 / max (ms) | chat p50 vs idle "
        "| load avg |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    chat = idle["chat"]
    print(
        f"| 0 (idle) | {idle['cpu'] * 100:.1f} | – | – | – | – | – | – | – | "
        f"{ms(idle_p50)} / {ms(pct(chat, 0.99))} / {ms(max(chat, default=float('nan')))} "
        f"| 1.00x | {idle.get('load', '')} |"
    )
    for r in rows:
        c = r["reports"]
        chat = r["chat"]
        p50 = statistics.median(chat) if chat else float("nan")
        print(
            f"| {r['nodes']:,} | {r['cpu'] * 100:.1f} | {r['simulator_cpu'] * 100:.0f} "
            f"| {ms(pct(r['latency'], 0.5))} / {ms(pct(r['latency'], 0.99))} "
            f"| {c['ok']:,} | {c['shed']:,} | {c['timeout']:,} | {c['error'] + c['refused']:,} "
            f"| {r['stale']} | {ms(p50)} / {ms(pct(chat, 0.99))} / "
            f"{ms(max(chat, default=float('nan')))} | {p50 / idle_p50:.2f}x | {r['load']} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,3000", help="sizes, comma-separated")
    parser.add_argument("--warm", type=float, default=20.0, help="seconds before measuring")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds measured per size")
    parser.add_argument("--json", help="write the figures to this file too")
    args = parser.parse_args(argv)
    sizes = sorted(int(n) for n in args.nodes.split(","))
    print(f"load average before: {load_average()} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="letsinfer-scale-") as tmp:
        root = Path(tmp)
        main_ = start_main(root)
        fleet: Fleet | None = None
        try:
            ident = main_.identity()
            cfg = {
                "ca": str(main_.ca()),
                "main_id": ident["node_id"],
                "control_port": main_.control_port,
            }
            print("idle main ...", flush=True)
            idle = measure_idle(main_, args.measure)
            idle["load"] = load_average()
            children: list[dict[str, str]] = []
            fleet = Fleet(cfg)
            rows = []
            recovered: float | None = None
            for n in sizes:
                started = time.monotonic()
                more = enroll(main_, root, len(children), n - len(children))
                print(
                    f"{n:,} nodes: enrolled {len(more):,} in "
                    f"{time.monotonic() - started:.0f}s; measuring ...",
                    flush=True,
                )
                children.extend(more)
                fleet.start(more)
                ids = [c["id"] for c in children]
                row = measure(main_, fleet, ids, args.warm, args.measure)
                row["metrics"] = metrics(main_)
                rows.append(row)
            if len(sizes) > 1:
                keep = sizes[0]
                fleet.stop(keep=keep)
                print(
                    f"load dropped to {fleet.size:,} nodes; "
                    "waiting for the main to take every report ...",
                    flush=True,
                )
                recovered = recover(main_, fleet, [c["id"] for c in children[: fleet.size]])
            report_rows(idle, rows)
            shed = sum(r["reports"]["shed"] for r in rows)
            if len(sizes) > 1:
                if recovered is None:
                    print(f"\nafter dropping to {fleet.size:,} nodes: NOT recovered within 120 s")
                else:
                    print(
                        f"\nafter dropping to {fleet.size:,} nodes: every report taken again after "
                        f"{recovered:.0f}s ({shed:,} reports shed over the run)"
                    )
            if args.json:
                Path(args.json).write_text(
                    json.dumps(
                        {
                            "idle": _plain(idle),
                            "rows": [_plain(r) for r in rows],
                            "recovered_s": recovered,
                        },
                        indent=2,
                    )
                )
        finally:
            if fleet is not None:
                fleet.stop()
            main_.server.stop()
    return 0


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its samples reduced to percentiles (for --json)."""
    out = {k: v for k, v in row.items() if k not in ("chat", "latency")}
    for name in ("chat", "latency"):
        if name in row:
            out[name] = {
                "p50": pct(row[name], 0.5),
                "p99": pct(row[name], 0.99),
                "n": len(row[name]),
            }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
