"""``letsinfer model upgrade|rollback|remove``: changing what runs a model, or
removing it, without taking away what serves before its replacement is proven."""

from __future__ import annotations

import click

from letsinfer.audit.anchor import open_authority
from letsinfer.authority import lifecycle
from letsinfer.cli.local import segment
from letsinfer.cli.model import model
from letsinfer.cli.model_gate import canary_option, gate_options, given_gate
from letsinfer.cli.model_install import report_rollout
from letsinfer.cli.output import console
from letsinfer.cli.remote import ask_main
from letsinfer.cli.scope import CliContext, scoped

_NEEDS_NODE = (
    "no node runs on this home: {what} drains and proves placement groups through the "
    "running main. Start it (`letsinfer up`, or `letsinfer service start`) and run this again"
)


@scoped(model, "upgrade", scope="main", remote="operator")
@click.argument("name")
@click.option(
    "--release",
    "release_id",
    required=True,
    help="The runtime release to run (`letsinfer release list`; `letsinfer release add` "
    "makes one of a llama-server binary).",
)
@click.option("--node", "nodes", multiple=True, help="Only the groups on this node; repeatable.")
@canary_option("the release")
@gate_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def upgrade(
    ctx: CliContext,
    name: str,
    release_id: str,
    nodes: tuple[str, ...],
    canary: float | None,
    eval_suite: str | None,
    min_score: float | None,
    as_json: bool,
) -> None:
    """Move a model's placement groups to another signed release, one group at a
    time: each replacement is proven (health and one answer) before the group it
    replaces drains; a failed one is removed and the group's exact prior release
    restored, and the upgrade stops. Exits 1 naming the group that failed.
    With --canary, only one new group starts, beside the others (with a gate,
    judged before it takes its share)."""
    body: dict[str, object] = {"release": release_id, "nodes": list(nodes)}
    if canary is not None:  # (a main of an earlier release refuses the field: not ignores it)
        body["canary"] = canary
    gate = given_gate(eval_suite, min_score)
    if gate is not None:
        body["gate"] = gate
    answer = ask_main(
        ctx, "POST", f"/v1/ops/models/{segment(name)}/upgrade", json=body, timeout=None
    )
    if answer is None:
        raise click.ClickException(_NEEDS_NODE.format(what="an upgrade"))
    if not as_json:
        model_name = answer["model"]
        what = f"canary of {model_name} on" if canary is not None else f"upgrade of {model_name} to"
        console.print(f"{what} {release_id}:", highlight=False)
    report_rollout(answer, as_json)


@scoped(model, "rollback", scope="main", remote="operator")
@click.argument("name")
@click.option(
    "--to",
    "to",
    help="A release this model ran before (`letsinfer model show NAME` lists them); "
    "default: each group's previous release.",
)
@click.option(
    "--weights",
    "weights",
    metavar="COMMIT",
    help="Instead of a release: weights this model ran before, by their commit (7+ "
    "characters) or sha256:DIGEST (`letsinfer model show NAME` lists them); kept "
    "in the model store, never downloaded again.",
)
@click.option("--node", "nodes", multiple=True, help="Only the groups on this node; repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def rollback(
    ctx: CliContext,
    name: str,
    to: str | None,
    weights: str | None,
    nodes: tuple[str, ...],
    as_json: bool,
) -> None:
    """Reinstall a release this model ran before: the signed release record kept
    in the authority, never re-resolved. One group at a time, as an upgrade.
    With --weights, the model's weights go back instead (its release stays)."""
    if weights is not None and to is not None:
        raise click.UsageError("--to names a release, --weights a model's weights: give one")
    verb, body = ("rollback", {"to": to, "nodes": list(nodes)})
    if weights is not None:
        verb, body = ("rollback-weights", {"to": weights, "nodes": list(nodes)})
    answer = ask_main(
        ctx, "POST", f"/v1/ops/models/{segment(name)}/{verb}", json=body, timeout=None
    )
    if answer is None:
        raise click.ClickException(_NEEDS_NODE.format(what="a rollback"))
    if not as_json:
        back = f" to weights {weights}" if weights is not None else ""
        console.print(f"rollback of {answer['model']}{back}:", highlight=False)
    report_rollout(answer, as_json)


@scoped(model, "remove", scope="main", remote="administrator")
@click.argument("name")
@click.option(
    "--stop",
    is_flag=True,
    help="Also when its placement groups run: they drain and stop first.",
)
@click.pass_obj
def remove(ctx: CliContext, name: str, stop: bool) -> None:
    """Remove a model: its placement groups, its release history, and its file in
    the model store when no other model uses those bytes. Refused while its
    groups should run, unless --stop."""
    answer = ask_main(
        ctx, "POST", f"/v1/ops/models/{segment(name)}/remove", json={"stop": stop}, timeout=None
    )
    if answer is None:  # no node runs: nothing serves it
        store = open_authority(ctx.home)
        try:
            answer = lifecycle.remove_model(
                store, ctx.home.model_store, name, stop=stop, actor="cli"
            ).to_json()
        except (lifecycle.NotFound, lifecycle.Refused) as exc:  # worded as the running main's
            raise click.ClickException(f"{exc}. Nothing changed.") from exc
        finally:
            store.close()
    groups = answer["placement_groups"]
    if answer["freed"]:
        freed = f"; freed {answer['freed']}"
    elif answer["shared"]:
        freed = f"; its file stays (used by {', '.join(answer['shared'])})"
    else:
        freed = ""
    console.print(
        f"removed model {answer['model']}: {len(groups)} placement group(s) removed{freed}",
        highlight=False,
    )
    # (.get: a node of an older release, mid-upgrade, does not say)
    if answer.get("adapters"):
        console.print(f"  its LoRA adapters went with it: {', '.join(answer['adapters'])}")
    if answer.get("fallbacks_cleared"):
        console.print(
            f"  no longer falling back to it: {', '.join(answer['fallbacks_cleared'])}",
            highlight=False,
        )
    if answer.get("keys_narrowed"):
        console.print(
            f"  dropped from the model lists of API keys: {', '.join(answer['keys_narrowed'])}",
            highlight=False,
        )
