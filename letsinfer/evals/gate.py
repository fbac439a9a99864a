"""Gates: the suite and score a model's new weights or release must reach
before they serve (``model gate``, ``--eval S --min-score X`` on ``model
update`` and ``model upgrade``).

The rollout starts the first replacement held out of clients' traffic
(letsinfer.gateway.routing ``hold``); the gate runs the suite against it
through the main's own gateway, every case pinned to it with the eval key
(``X-Letsinfer-Group``), keeps the run like ``letsinfer eval`` does, and
audits the verdict with its score. Below the minimum, the rollout removes
the replacement and the old group serves on.

The CLI reads a suite file (as the user who runs it, who may read what the
main's service may not) and sends its text; a built-in suite goes by name.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from letsinfer import config
from letsinfer.config import GatewaySettings
from letsinfer.evals.key import eval_key
from letsinfer.evals.runner import KEY_WAIT_S, EvalError, Gateway, run_suite
from letsinfer.evals.suite import MAX_SUITE_BYTES, Suite, SuiteError, load, parse
from letsinfer.home import Home
from letsinfer.lifecycle.rollout import RolloutRefused, Verdict, Vet
from letsinfer.lifecycle.serving import Serving
from letsinfer.store import AuthorityStore

JSONL_SUFFIXES = (".jsonl", ".ndjson")


@dataclass(frozen=True)
class GateSpec:
    """What a gate runs: ``suite`` (a built-in suite's name, or the file it was
    read from), the file's ``text`` when it is one, and the minimum score."""

    suite: str
    min_score: float
    text: str | None = None

    def load(self) -> Suite:
        """The suite (SuiteError: it cannot run)."""
        if self.text is None:
            return load(self.suite)
        return parse(self.text, self.suite, jsonl=self.suite.endswith(JSONL_SUFFIXES))


def check_min_score(value: float) -> float:
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"--min-score is a score from 0 to 1, not {value}")
    return value


def read_spec(given: str, min_score: float) -> GateSpec:
    """A gate as the CLI sends it: a suite file read now (its absolute path as
    its name), or a built-in suite's name. Checked: SuiteError when it cannot run."""
    check_min_score(min_score)
    path = Path(given)
    if path.is_file():
        if path.stat().st_size > MAX_SUITE_BYTES:
            raise SuiteError(given, None, "", f"larger than {MAX_SUITE_BYTES} bytes")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SuiteError(given, None, "", f"cannot be read: {exc}") from None
        spec = GateSpec(str(path.resolve()), min_score, text)
    else:
        spec = GateSpec(given, min_score)
    spec.load()
    return spec


def gate_vet(
    store: AuthorityStore,
    home: Home,
    gateway_url: str,
    model: str,
    spec: GateSpec,
    *,
    actor: str,
    role: str | None,
) -> Vet:
    """The judge a rollout asks about its first replacement (run on the
    main's gateway loop: the suite's requests go out from a worker thread
    while the loop serves them)."""

    async def vet(pg_id: str) -> Verdict:
        suite = spec.load()
        secret, made_now = eval_key(store, home)
        gateway = Gateway(gateway_url, secret, key_wait_s=KEY_WAIT_S if made_now else 0)
        try:
            done = await asyncio.to_thread(run_suite, suite, model, gateway, pg_id)
        except EvalError as exc:
            said = f"suite {suite.name} could not run: {exc}"
            store.append_audit(
                actor, "model.gate", "failed", role=role, target=model, detail=said[:1000]
            )
            return Verdict(False, said, {"suite": suite.name, "group": pg_id, "error": str(exc)})
        finally:
            gateway.close()
        passed = done.record.score >= spec.min_score
        record = dataclasses.replace(done.record, threshold=spec.min_score, passed=passed)
        said = (
            f"suite {suite.name} scored {record.score:.4f}, "
            f"{'at or above' if passed else 'below'} {spec.min_score:g}; eval run {record.id}"
        )
        with store.transaction():
            store.add_eval_run(record, done.cases)
            store.append_audit(
                actor,
                "model.gate",
                "ok" if passed else "failed",
                role=role,
                target=model,
                detail=(
                    f"run={record.id} suite={suite.name} score={record.score:.4f} "
                    f"min_score={spec.min_score:g} passed={'yes' if passed else 'no'} group={pg_id}"
                ),
            )
        return Verdict(
            passed,
            said,
            {
                "suite": suite.name,
                "group": pg_id,
                "score": record.score,
                "min_score": spec.min_score,
                "passed": passed,
                "run": record.id,
            },
        )

    return vet


class GivenGate(Protocol):
    """A gate as a request carries it (letsinfer.control.ops.rollouts.GateBody)."""

    suite: str
    min_score: float
    text: str | None


class Gates:
    """Where gates run on a main: its home (the eval key) and its gateway."""

    def __init__(self, home: Home, gateway: GatewaySettings | None = None) -> None:
        """``gateway``: the main's gateway settings (default: as its config says)."""
        self.home = home
        gw = gateway or config.load(home.config_file).gateway
        self.gateway_url = local_gateway_url(gw.host, gw.port)


def gate_for(
    gates: Gates | None,
    sv: Serving,
    model: str,
    given: GivenGate | None,
    *,
    actor: str,
    role: str | None,
) -> Vet | None:
    """The judge for a rollout of ``model``: the gate the command gave, else
    the model's own (``model gate``), else none. RolloutRefused, before
    anything changes, when its suite cannot run or no gate can run here."""
    if given is not None:
        spec = GateSpec(given.suite, given.min_score, given.text)
    else:
        kept = sv.store.get_gate(model)
        if kept is None:
            return None
        spec = GateSpec(kept.suite, kept.min_score)
    try:
        spec.load()
    except SuiteError as exc:
        raise RolloutRefused(f"the gate's suite cannot run: {exc}", 400) from None
    if gates is None:
        raise RolloutRefused("no gateway runs here to hold and judge a replacement", 503)
    return gate_vet(sv.store, gates.home, gates.gateway_url, model, spec, actor=actor, role=role)


def local_gateway_url(host: str, port: int) -> str:
    """The main's gateway as this machine reaches it (as `letsinfer eval` does)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return f"http://{shown}:{port}"
