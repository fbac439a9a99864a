"""Proof at the door: a model file is admitted only after its engine served it.

``model add`` (and everything that admits a file the same way) runs the file
in the engine of the release it will run under, on loopback, and asks it one
real request (a one-token completion, or one embedding). A file the engine
cannot load or serve is refused with the engine's own error lines; the
engine is gone before the answer, whatever happened.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from letsinfer.agent.ports import free_port
from letsinfer.engines.diagnosis import error_lines
from letsinfer.engines.launch import EngineTask, plan_llamacpp
from letsinfer.engines.proof import ProofRequest, prove_now
from letsinfer.engines.releases import Release, check_binary

_PR_SET_PDEATHSIG = 1
_HOST = "127.0.0.1"


class DoorRefused(Exception):
    """The engine could not serve the file; the message carries its own words."""


@dataclass(frozen=True)
class Door:
    """How the trial engine runs: small, since it answers one request."""

    threads: int = 2
    context: int = 512
    ready_timeout_s: float = 120.0
    stop_grace_s: float = 5.0
    # The engines' own port span: a port the kernel hands out for any outgoing
    # connection could be taken before the trial engine binds it, and a good
    # file would be refused for "address already in use".
    ports: tuple[int, int] | None = None
    # Where the trial engine's files go (the system's temp otherwise), in a
    # folder named ``scratch_prefix...part``: `model add` puts it beside the
    # file it proves, named as that file is, so the next node start removes
    # the folder of a prover killed mid-trial as it removes the partial file.
    scratch: Path | None = None
    scratch_prefix: str = "letsinfer-door-"


def _child_setup() -> None:  # between fork and exec: dies with the prover
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def prove_model_file(release: Release, model: Path, kind: str, door: Door) -> None:
    """Raise DoorRefused unless ``release``'s engine loads ``model`` and answers
    one ``kind`` request ("completion" or "embedding")."""
    try:
        check_binary(release)
    except Exception as exc:
        raise DoorRefused(str(exc)) from exc
    with tempfile.TemporaryDirectory(
        prefix=door.scratch_prefix, suffix=".part", dir=door.scratch
    ) as tmp:
        run_dir = Path(tmp)
        task = EngineTask(
            pg_id="door",
            model_name=model.stem,
            model_path=model,
            host=_HOST,
            port=free_port(_HOST, door.ports),
            engine_key=secrets.token_urlsafe(24),
            threads=door.threads,
            context=door.context,
            parallel=1,
            proof=kind,
        )
        plan = plan_llamacpp(release, task, run_dir)
        for path, content in plan.files.items():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(content)
        log_path = run_dir / "engine.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                plan.argv,
                env={**os.environ, **plan.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_child_setup,
            )
        try:
            failed = _trial(proc, plan.health_url, plan.base_url, plan.proof, door)
        finally:
            _stop(proc, door.stop_grace_s)
        if failed is not None:
            said = error_lines(log_path.read_text(errors="replace"))
            raise DoorRefused(f"{failed}: {said}" if said else failed)


def _trial(
    proc: subprocess.Popen[bytes],
    health_url: str,
    base_url: str,
    proof: ProofRequest | None,
    door: Door,
) -> str | None:
    deadline = time.monotonic() + door.ready_timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return f"the engine exited with code {proc.returncode} before it served"
            with contextlib.suppress(httpx.HTTPError):
                if client.get(health_url).status_code == 200:
                    if proof is None:
                        return None
                    left = max(deadline - time.monotonic(), 1.0)
                    return prove_now(client, base_url, proof, left)
            time.sleep(0.1)
    return f"the engine did not become healthy within {door.ready_timeout_s:.0f}s"


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def prover(release: Release, door: Door) -> Callable[[Path, str], str | None]:
    """The proof at the door as `model add` takes it: why ``release``'s engine
    could not serve a file of a kind, or None once it did."""

    def prove(model: Path, kind: str) -> str | None:
        try:
            prove_model_file(release, model, kind, door)
        except DoorRefused as exc:
            return str(exc)
        return None

    return prove
