"""The proof an engine must pass before a restarted node adopts it, checked
against real processes: what a rewritten, linked or stale record gets."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from letsinfer.agent import reattach
from letsinfer.agent.processes import AdoptedProcess
from tests.nodes import free_port

ENGINE = """
import http.server, os, sys
KEY = os.environ["KEY"]
class Engine(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" or self.headers.get("authorization") == "Bearer " + KEY
        self.send_response(200 if ok else 401); self.end_headers(); self.wfile.write(b"{}")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Engine).serve_forever()
"""


@pytest.fixture
def engine(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A stand-in engine launched as the supervisor launches one, and its record."""
    port, nonce = free_port(), reattach.new_nonce()
    argv = [sys.executable, "-c", ENGINE, str(port)]
    env = {**os.environ, "KEY": "k-123", reattach.NONCE_ENV: nonce}
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except httpx.HTTPError:
            assert proc.poll() is None
    ticks = reattach.start_ticks(proc.pid)
    assert ticks is not None
    record = reattach.LaunchRecord(
        pg_id="pg-1",
        task="0",
        service="m",
        placement="f" * 64,
        release_id="r",
        base_url=f"http://127.0.0.1:{port}",
        port=port,
        pid=proc.pid,
        start_ticks=ticks,
        boot_id=reattach.boot_id(),
        uid=os.geteuid(),
        argv=argv,
        nonce=nonce,
        engine_key="k-123",
    )
    yield record
    proc.kill()
    proc.wait()


def _prove(record: reattach.LaunchRecord) -> str | None:
    async def run() -> str | None:
        async with httpx.AsyncClient(timeout=5) as client:
            got = await reattach.prove(record, client)
        if isinstance(got, AdoptedProcess):
            got.close()
            return None
        return got

    return asyncio.run(run())


def test_the_engine_it_launched_is_proven(engine: reattach.LaunchRecord) -> None:
    assert _prove(engine) is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"start_ticks": 1}, "another process now"),
        ({"argv": [sys.executable, "-c", "pass"]}, "another command line"),
        ({"nonce": "0" * 32}, "does not carry the launch nonce"),
        ({"engine_key": "k-stolen"}, "does not hold this placement group's engine key"),
        ({"boot_id": "other"}, "before this machine last booted"),
        ({"pid": 1}, "pid 1"),
    ],
)
def test_a_rewritten_record_proves_nothing(
    engine: reattach.LaunchRecord, change: dict[str, object], why: str
) -> None:
    assert why in (_prove(engine.model_copy(update=change)) or "adopted")


def test_a_process_that_does_not_listen_on_the_port_is_not_the_engine(
    engine: reattach.LaunchRecord,
) -> None:
    other = free_port()
    why = _prove(engine.model_copy(update={"port": other, "base_url": f"http://127.0.0.1:{other}"}))
    assert why is not None and f"does not listen on port {other}" in why


def test_a_linked_or_loose_record_is_not_read(
    tmp_path: Path, engine: reattach.LaunchRecord
) -> None:
    good = reattach.record_path(tmp_path, "pg-1", "0")
    reattach.write_record(good, engine)
    assert good.stat().st_mode & 0o777 == 0o600
    [found] = reattach.read_records(tmp_path)
    assert found.record == engine

    good.chmod(0o644)
    assert "mode 644" in str(reattach.read_records(tmp_path)[0].problem)
    good.unlink()
    elsewhere = tmp_path / "elsewhere.json"
    reattach.write_record(elsewhere, engine)
    good.symlink_to(elsewhere)
    assert "without following links" in str(reattach.read_records(tmp_path)[0].problem)
    good.unlink()
    reattach.write_record(reattach.record_path(tmp_path, "pg-2", "0"), engine)
    assert "not its file name" in str(reattach.read_records(tmp_path)[0].problem)
