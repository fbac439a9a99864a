"""``letsinfer model pull``: a model by repository name, from the hub or the mirror."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from letsinfer.cli.model import model
from letsinfer.cli.model_add import Where, admit_gguf, placement_options
from letsinfer.cli.model_scale import checked_policy, said_policy, scale_options
from letsinfer.cli.output import console, errors
from letsinfer.cli.scope import CliContext, scoped
from letsinfer.store import StoreError

if TYPE_CHECKING:  # the hub client (huggingface_hub) loads only when a pull runs
    from letsinfer import config
    from letsinfer.hub.pull import Located
    from letsinfer.hub.sources import HubSource


def hub_source(ctx: CliContext, settings: config.Settings) -> HubSource | None:
    from letsinfer.fetch import FetchPolicy
    from letsinfer.hub.client import HubClient, read_token
    from letsinfer.hub.sources import HubSource

    hub = settings.hub
    if not hub.enabled:
        return None
    client = HubClient(
        hub.endpoint, read_token(hub.token_file), hub.timeout_s, FetchPolicy.from_settings(settings)
    )
    return HubSource(client, ctx.home.downloads)


def _same_pull(existing: dict[str, object] | None, located: Located) -> bool:
    return (
        existing is not None
        and existing.get("commit") == located.snapshot.commit
        and [
            f["sha256"]
            for f in existing.get("files", [])  # type: ignore[attr-defined]
        ]
        == [p.sha256 for p in located.model.parts]
    )


def _audit_denied(ctx: CliContext, target: str, why: str) -> None:
    from letsinfer.audit.anchor import open_authority

    store = open_authority(ctx.home)
    try:
        store.append_audit("cli", "model.pull", "denied", target=target, detail=why[:500])
    finally:
        store.close()


@scoped(model, "pull", scope="main")
@click.argument("repo")
@click.option("--file", "file", metavar="NAME", help="The GGUF file in the repository.")
@click.option("--quant", metavar="Q", help="Pick the GGUF file by quantisation (e.g. Q4_K_M).")
@click.option(
    "--revision",
    default="main",
    show_default=True,
    help="Branch, tag or commit; recorded as the commit it resolves to.",
)
@click.option("--name", metavar="N", help="Model name (default: REPO, or REPO:QUANT).")
@click.option("--alias", "aliases", multiple=True, help="Another name clients may use.")
@click.option(
    "--engine",
    type=click.Choice(["xllamacpp", "llama-server"]),
    metavar="ENGINE",
    help="Engine to run it: xllamacpp or llama-server (default: the node's configured one).",
)
@click.option(
    "--no-serve",
    is_flag=True,
    help="Only register it; place it later with `letsinfer model install`.",
)
@placement_options
@scale_options
@click.pass_obj
def pull(
    ctx: CliContext,
    repo: str,
    file: str | None,
    quant: str | None,
    revision: str,
    name: str | None,
    aliases: tuple[str, ...],
    engine: str | None,
    no_serve: bool,
    nodes: tuple[str, ...],
    target: str,
    gpus: int,
    **scaling: Any,
) -> None:
    """Pull a GGUF model from a Hugging Face-compatible hub ([hub] endpoint), or from
    this node's mirror when the hub is off or unreachable: resolve the revision to
    a commit, download with resume, verify the published sha256, then add and
    serve it like `model add` (where it fits: this node by default, --node to
    choose). Repo, commit and sha256 are recorded with it."""
    from letsinfer import config
    from letsinfer.audit.anchor import open_authority
    from letsinfer.authority.models import check_model_name
    from letsinfer.cli.bundle import TerminalProgress
    from letsinfer.hub.choice import ChoiceError
    from letsinfer.hub.client import HubError
    from letsinfer.hub.pull import PullRequest, fetched, locate
    from letsinfer.hub.sources import ChecksumMismatch, MirrorSource
    from letsinfer.hub.splits import SplitError
    from letsinfer.mirror.catalog import CatalogError
    from letsinfer.mirror.layout import MirrorLayout

    if file and quant:
        raise click.UsageError("give --file or --quant, not both")
    where = Where(nodes, target, gpus)
    where.refuse_with_no_serve(no_serve)
    scale = checked_policy(scaling)
    if scale.get("min_groups") == 0:  # on demand: loaded where it fits at its first request
        where.refuse_on_demand()
        no_serve = True
    request = PullRequest(repo=repo, revision=revision, file=file, quant=quant)
    name = name or request.default_name()
    check_model_name(name)
    for alias in aliases:
        check_model_name(alias)
    settings = config.load(ctx.home.config_file)
    progress = TerminalProgress(errors)
    try:
        located = locate(
            request, hub_source(ctx, settings), MirrorSource(MirrorLayout.for_home(ctx.home))
        )
    except (HubError, ChoiceError, CatalogError) as exc:
        raise click.ClickException(f"{exc}. Nothing changed.") from exc
    if located.hub_skipped:
        errors.print(
            f"[yellow]hub not used[/yellow]: {located.hub_skipped}; "
            f"pulling from this node's {located.snapshot.where}"
        )
    store = open_authority(ctx.home)
    try:
        existing = store.resolve_service(name)
    finally:
        store.close()
    if existing is not None:
        if _same_pull(existing.origin, located):
            console.print(
                f"model [bold]{existing.name}[/bold] is already "
                f"{repo}@{located.snapshot.commit[:12]}; nothing changed"
            )
            return
        raise click.ClickException(
            f"model {name!r} already exists; choose another name with --name. Nothing changed."
        )
    model_files = located.model
    errors.print(
        f"{repo}@{revision} is commit {located.snapshot.commit}: {model_files.label} "
        f"({model_files.size / 1e6:.1f} MB, {len(model_files.parts)} file(s)) "
        f"from {located.snapshot.where}"
    )
    try:
        with fetched(located, ctx.home.downloads, progress) as path:
            svc = admit_gguf(
                ctx, name, path, aliases, engine, no_serve, where, origin=located.origin()
            )
    except ChecksumMismatch as exc:
        _audit_denied(ctx, f"{repo}@{located.snapshot.commit}", str(exc))
        raise click.ClickException(f"{exc}. Nothing changed.") from exc
    except (HubError, SplitError, StoreError) as exc:
        raise click.ClickException(f"{exc}. Nothing changed.") from exc
    except OSError as exc:  # a full disk, a folder it may not write
        raise click.ClickException(
            f"cannot write the download under {ctx.home.downloads} ({exc}). Nothing changed."
        ) from exc
    console.print(f"  repo     {repo}")
    console.print(f"  commit   {located.snapshot.commit}")
    console.print(f"  sha256   {svc.artifact_digest}")
    said_policy(ctx, svc.name, scale)
