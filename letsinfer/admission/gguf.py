"""`model add --gguf` and `model pull` admit a file the one way: checked,
placed by the install planner where it fits, proven in its engine, stored
and recorded; where it fits nowhere, nothing changes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from letsinfer import config
from letsinfer.admission.said import Say
from letsinfer.audit.anchor import open_authority
from letsinfer.authority import install as install_mod
from letsinfer.authority.models import FirstGroup, add_gguf_model
from letsinfer.authority.modelstore import partial_prefix, partials_dir
from letsinfer.engines import releases
from letsinfer.engines.binary import BinaryError
from letsinfer.fit.estimate import size_text
from letsinfer.fit.shape import ShapeError, read_shape
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.lifecycle.door import Door, prover
from letsinfer.release import runtime
from letsinfer.store import ServiceRecord, StoreError


class Refused(Exception):
    """Refused before anything changed; the message says so."""


@dataclass(frozen=True)
class Where:
    """Where a model added now serves: the nodes (default: the main), the
    target and the GPUs per group."""

    nodes: tuple[str, ...] = ()
    target: str = "auto"
    gpus: int = 1


def admit_gguf(
    home: Home,
    identity: NodeIdentity,
    say: Say,
    name: str,
    gguf_path: Path,
    aliases: tuple[str, ...],
    engine: str | None,
    no_serve: bool,
    where: Where,
    origin: dict[str, Any] | None = None,
    fallback: str | None = None,
    actor: str = "cli",
) -> ServiceRecord:
    """The model added (Refused, or StoreError: nothing changed). Unless
    ``no_serve``, the install planner places it before any engine loads it."""
    settings = config.load(home.config_file)
    try:
        release = releases.for_engine_kind(
            engine or settings.engine.kind, settings.engine.llama_server_binary
        )
    except BinaryError as exc:
        raise Refused(f"cannot release the llama-server binary: {exc}. Nothing changed.") from exc
    store = open_authority(home)
    refused: list[StoreError] = []  # the planner's own refusal (said with "Nothing changed.")

    def place(path: Path) -> list[FirstGroup]:
        try:
            shape = read_shape(path)
        except ShapeError as exc:
            refused.append(
                StoreError(
                    f"{exc}: cannot check whether {name} fits anywhere "
                    "(--no-serve registers it without placing it)"
                )
            )
            raise refused[-1] from exc
        req = install_mod.InstallRequest(
            service=name,
            nodes=where.nodes or (identity.name,),
            target=where.target,
            gpus=where.gpus,
            engine=engine or settings.engine.kind,
            llama_server_binary=settings.engine.llama_server_binary,
            shape=shape,
            context=settings.engine.context,
            slots=settings.engine.parallel,
        )
        found = install_mod.plan_groups(
            store, req, settings.control.node_stale_after_s, identity.node_id
        )
        show_plan(say, found)
        if not found.placements:
            reasons = "; ".join(f"{n}: {w}" for n, w in found.skipped)
            refused.append(StoreError(f"no node can take model {name!r} ({reasons})"))
            raise refused[-1]
        return [
            FirstGroup(p.node.id, p.release, runtime.sign(home, p.release), p.gpus)
            for p in found.placements
        ]

    try:
        svc, pgs = add_gguf_model(
            store,
            home.model_store,
            name,
            gguf_path,
            release=release,
            place=None if no_serve else place,
            aliases=aliases,
            actor=actor,
            release_signature=runtime.sign(home, release),
            origin=origin,
            prove=prover(
                release,
                Door(
                    threads=settings.engine.threads,
                    ready_timeout_s=settings.engine.ready_timeout_s,
                    ports=(settings.engine.port_first, settings.engine.port_last),
                    scratch=partials_dir(home.model_store),
                    scratch_prefix=partial_prefix() + "door-",
                ),
            ),
            fallback=fallback,
        )
        nodes = {n.id: n.name for n in store.list_nodes()}
    except StoreError as exc:
        if exc not in refused:
            raise
        raise Refused(f"{exc}. Nothing changed.") from exc
    finally:
        store.close()
    where_text = (
        "; ".join(
            f"placement group {pg.id} on {nodes.get(pg.node_id, pg.node_id)} with {pg.release_id}"
            for pg in pgs
        )
        if pgs
        else "not placed yet (`letsinfer model install`)"
    )
    say(
        f"added model [bold]{svc.name}[/bold] (sha256:{svc.artifact_digest[:12]}, "
        f"{svc.artifact_size / 1e6:.1f} MB); {where_text}"
    )
    return svc


def show_plan(say: Say, plan: install_mod.InstallPlan) -> None:
    """Each placement a plan makes, and each node it skips with why."""
    for p in plan.placements:
        gpus_text = f" on {', '.join(p.gpus)}" if p.gpus else ""
        note = f" (replaces {p.replaces})" if p.replaces else ""
        fit = f", needs {fit_text(p)}" if p.need else ""
        say(f"  [green]install[/green] {p.node.name}: {p.release.id}{gpus_text}{fit}{note}")
    for node_name, why in plan.skipped:
        say(f"  [yellow]skip[/yellow]    {node_name}: {why}")


def fit_text(p: install_mod.Placement) -> str:
    assert p.need is not None
    where = (
        f"per GPU of {len(p.gpus)}"
        if len(p.gpus) > 1
        else ("of GPU memory" if p.gpus else "of RAM")
    )
    return f"{size_text(p.need.on(max(len(p.gpus), 1)))} {where}"
