"""``letsinfer model update``: a model pulled from a hub (or a mirror) moves to
a new commit of its repository: resolved, downloaded and verified as `model
pull` does, then rolled out one group at a time as `model upgrade` does."""

from __future__ import annotations

from typing import Any

import click

from letsinfer.cli.local import segment
from letsinfer.cli.model import model
from letsinfer.cli.model_gate import gate_options, given_gate
from letsinfer.cli.model_install import report_rollout
from letsinfer.cli.output import console, emit_object, errors
from letsinfer.cli.remote import ask_main
from letsinfer.cli.scope import CliContext, scoped

_NEEDS_NODE = (
    "no node runs on this home: an update drains and proves placement groups through the "
    "running main. Start it (`letsinfer up`, or `letsinfer service start`) and run this again"
)


def _audit_denied(ctx: CliContext, target: str, why: str) -> None:
    from letsinfer.audit.anchor import open_authority

    store = open_authority(ctx.home)
    try:
        store.append_audit("cli", "model.update", "denied", target=target, detail=why[:500])
    finally:
        store.close()


@scoped(model, "update", scope="main")
@click.argument("name")
@click.option(
    "--revision",
    help="Branch, tag or commit of the model's repository (default: the revision it was "
    "pulled at, e.g. main, resolved again now).",
)
@click.option("--node", "nodes", multiple=True, help="Only the groups on this node; repeatable.")
@click.option(
    "--canary",
    "canary",
    type=click.FloatRange(0, 100, min_open=True, max_open=True),
    metavar="PERCENT",
    help="Start one new group on the new weights beside the others and give it this "
    "share of the model's requests, until `letsinfer model promote` (the rest follow) or "
    "`letsinfer model abort` (it goes); `letsinfer model canary` compares both sides.",
)
@gate_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def update(
    ctx: CliContext,
    name: str,
    revision: str | None,
    nodes: tuple[str, ...],
    canary: float | None,
    eval_suite: str | None,
    min_score: float | None,
    as_json: bool,
) -> None:
    """Move a pulled model to a new commit of the repository it came from: resolve
    the revision on the hub (or this node's mirror), download and verify it like
    `model pull`, then replace its placement groups one at a time, each new one
    proven before the old one drains. The weights it ran stay kept for `model
    rollback NAME --weights COMMIT`. Exits 1 naming the group that failed.
    With --canary, only one new group starts, beside the others."""
    from letsinfer import config
    from letsinfer.admission.pull import hub_source
    from letsinfer.audit.anchor import open_authority
    from letsinfer.authority.modelstore import stage_gguf
    from letsinfer.cli.bundle import TerminalProgress
    from letsinfer.contracts.artifacts import ModelFileError
    from letsinfer.hub.choice import ChoiceError
    from letsinfer.hub.client import HubError
    from letsinfer.hub.pull import PullRequest, fetched, locate
    from letsinfer.hub.sources import ChecksumMismatch, MirrorSource
    from letsinfer.hub.splits import SplitError
    from letsinfer.mirror.catalog import CatalogError
    from letsinfer.mirror.layout import MirrorLayout

    gate = given_gate(eval_suite, min_score)
    store = open_authority(ctx.home)
    try:
        svc = store.resolve_service(name)
    finally:
        store.close()
    if svc is None:
        raise click.ClickException(f"no model {name!r} (see `letsinfer model list`)")
    origin = svc.origin
    if not origin or not origin.get("files"):
        raise click.ClickException(
            f"model {svc.name} has no recorded origin (it was added from a file, not pulled): "
            "nothing to update it from. Nothing changed."
        )
    request = PullRequest(
        repo=origin["repo"],
        revision=revision or origin.get("revision") or "main",
        file=origin["files"][0]["name"],
    )
    settings = config.load(ctx.home.config_file)
    try:
        located = locate(
            request, hub_source(ctx.home, settings), MirrorSource(MirrorLayout.for_home(ctx.home))
        )
    except (HubError, ChoiceError, CatalogError) as exc:
        raise click.ClickException(f"{exc}. Nothing changed.") from exc
    if located.hub_skipped:
        errors.print(
            f"[yellow]hub not used[/yellow]: {located.hub_skipped}; "
            f"updating from this node's {located.snapshot.where}"
        )
    commit = located.snapshot.commit
    sha256s = [p.sha256 for p in located.model.parts]
    if commit == origin.get("commit") and sha256s == [f["sha256"] for f in origin["files"]]:
        if as_json:
            emit_object({"model": svc.name, "commit": commit, "changed": False})
        else:
            console.print(
                f"model [bold]{svc.name}[/bold] is already {request.repo}@{commit[:12]}; "
                "nothing changed"
            )
        return
    errors.print(
        f"{request.repo}@{request.revision} is commit {commit}: {located.model.label} "
        f"({located.model.size / 1e6:.1f} MB) from {located.snapshot.where}"
    )
    progress = TerminalProgress(errors)
    try:
        with fetched(located, ctx.home.downloads, progress) as path:
            staged = stage_gguf(ctx.home.model_store, path)
            if staged.kind != svc.kind:
                staged.discard()
                raise click.ClickException(
                    f"{request.repo}@{commit[:12]} is an {staged.kind} model; {svc.name} "
                    f"serves {svc.kind}s. Nothing changed."
                )
            artifact = staged.commit()
    except ChecksumMismatch as exc:
        _audit_denied(ctx, f"{request.repo}@{commit}", str(exc))
        raise click.ClickException(f"{exc}. Nothing changed.") from exc
    except (HubError, SplitError, ModelFileError) as exc:
        raise click.ClickException(f"{exc}. Nothing changed.") from exc
    except OSError as exc:
        raise click.ClickException(
            f"cannot write the download under {ctx.home.downloads} ({exc}). Nothing changed."
        ) from exc
    body: dict[str, Any] = {
        "sha256": artifact.digest,
        "size": artifact.size,
        "origin": located.origin(),
        "nodes": list(nodes),
    }
    if gate is not None:
        body["gate"] = gate
    if canary is not None:
        body["canary"] = canary
    answer = ask_main(
        ctx, "POST", f"/v1/ops/models/{segment(svc.name)}/update", json=body, timeout=None
    )
    if answer is None:
        raise click.ClickException(_NEEDS_NODE)
    if not as_json:
        what = "canary of {} on" if canary is not None else "update of {} to"
        console.print(
            f"{what.format(answer['model'])} {request.repo}@{commit[:12]} "
            f"(sha256:{artifact.digest[:12]}):",
            highlight=False,
        )
    report_rollout(answer, as_json)
