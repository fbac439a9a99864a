"""Lifecycle commands report a state that is true: they wait (bounded) until
a model's placement groups reach it, reading states as every display does
(letsinfer.authority.states)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from letsinfer.cli.scope import CliContext
from letsinfer.cli.shown import read_scene, read_store

# Shown states a group leaves by itself; any other stays until someone acts
# (ready, parked, failed, paused, stopped, unreachable, down, system stopped).
MOVING = frozenset({"starting", "restarting", "pending", "stopping", "draining"})


@dataclass(frozen=True)
class Group:
    id: str
    node: str
    state: str
    detail: str | None


@dataclass(frozen=True)
class ModelNow:
    model: str
    state: str
    groups: tuple[Group, ...]

    @property
    def settled(self) -> bool:
        return not any(g.state in MOVING for g in self.groups)


def model_now(ctx: CliContext, name: str) -> ModelNow:
    if ctx.remote is not None:
        return _model_on_main(ctx, name)
    store = read_store(ctx.home)
    try:
        svc = store.resolve_service(name)
        if svc is None:  # removed meanwhile
            return ModelNow(name, "not placed", ())
        scene = read_scene(ctx, store)
        pgs = store.list_placement_groups(service=svc.name)
        return ModelNow(
            svc.name,
            scene.service_state(svc, pgs, on_demand=store.scaling_policy(svc.name).on_demand),
            tuple(
                Group(pg.id, scene.node_name(pg.node_id), scene.group_state(pg), pg.detail)
                for pg in pgs
            ),
        )
    finally:
        store.close()


def settle(
    ctx: CliContext,
    name: str,
    done: Callable[[ModelNow], bool],
    timeout_s: float,
    poll_s: float = 0.25,
) -> ModelNow:
    """The model once ``done`` holds, or as it is when ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = model_now(ctx, name)
        if done(now) or time.monotonic() >= deadline:
            return now
        time.sleep(poll_s)


def _model_on_main(ctx: CliContext, name: str) -> ModelNow:
    """From a controller: the model as the main's `model show` has it (the
    same states, read from the same scene)."""
    import click

    from letsinfer.cli.local import segment
    from letsinfer.cli.remote import call

    try:
        shown = call(ctx.remote, "GET", f"/v1/ops/models/{segment(name)}/show")
    except click.ClickException as exc:
        if exc.message.startswith("no model"):  # removed meanwhile
            return ModelNow(name, "not placed", ())
        raise
    return ModelNow(
        shown["name"],
        shown["state"],
        tuple(
            Group(g["id"], g["node"], g["state"], g["detail"]) for g in shown["placement_groups"]
        ),
    )
