"""`model pull`: a model by repository name, from the hub or the main's
mirror, verified, then admitted as `model add --gguf` admits a file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from letsinfer import config
from letsinfer.admission.gguf import Refused, Where, admit_gguf
from letsinfer.admission.said import Say
from letsinfer.audit.anchor import open_authority
from letsinfer.authority.models import check_model_name
from letsinfer.bundle.progress import Progress
from letsinfer.home import Home
from letsinfer.hub.pull import PullRequest
from letsinfer.identity import NodeIdentity
from letsinfer.store import ServiceRecord, StoreError

if TYPE_CHECKING:  # the hub client (huggingface_hub) loads only when a pull runs
    from letsinfer.hub.pull import Located
    from letsinfer.hub.sources import HubSource


@dataclass(frozen=True)
class Pull:
    """What `model pull` was asked (its options checked by the CLI, or by
    the admin API's body)."""

    request: PullRequest
    name: str | None = None
    aliases: tuple[str, ...] = ()
    engine: str | None = None
    no_serve: bool = False
    where: Where = field(default_factory=Where)


def hub_source(home: Home, settings: config.Settings) -> HubSource | None:
    from letsinfer.fetch import FetchPolicy
    from letsinfer.hub.client import HubClient, read_token
    from letsinfer.hub.sources import HubSource

    hub = settings.hub
    if not hub.enabled:
        return None
    client = HubClient(
        hub.endpoint, read_token(hub.token_file), hub.timeout_s, FetchPolicy.from_settings(settings)
    )
    return HubSource(client, home.downloads)


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


def audit_denied(home: Home, actor: str, action: str, target: str, why: str) -> None:
    store = open_authority(home)
    try:
        store.append_audit(actor, action, "denied", target=target, detail=why[:500])
    finally:
        store.close()


def located_files(home: Home, request: PullRequest, say: Say, doing: str) -> Located:
    """Where ``request``'s files come from: the hub, else this node's mirror
    (said, when the hub was skipped); Refused, nothing changed, when neither
    has them. ``doing``: what the caller does, for what is said."""
    from letsinfer.hub.choice import ChoiceError
    from letsinfer.hub.client import HubError
    from letsinfer.hub.pull import locate
    from letsinfer.hub.sources import MirrorSource
    from letsinfer.mirror.catalog import CatalogError
    from letsinfer.mirror.layout import MirrorLayout

    settings = config.load(home.config_file)
    try:
        located = locate(
            request, hub_source(home, settings), MirrorSource(MirrorLayout.for_home(home))
        )
    except (HubError, ChoiceError, CatalogError) as exc:
        raise Refused(f"{exc}. Nothing changed.") from exc
    if located.hub_skipped:
        say(
            f"[yellow]hub not used[/yellow]: {located.hub_skipped}; "
            f"{doing} from this node's {located.snapshot.where}",
            err=True,
        )
    return located


def pull_model(
    home: Home,
    identity: NodeIdentity,
    say: Say,
    progress: Progress,
    ask: Pull,
    actor: str = "cli",
) -> ServiceRecord | None:
    """The model pulled and added; None when it is there already, from the
    same commit and files. Refused (or StoreError, for a bad name): nothing
    changed."""
    from letsinfer.hub.client import HubError
    from letsinfer.hub.pull import fetched
    from letsinfer.hub.sources import ChecksumMismatch
    from letsinfer.hub.splits import SplitError

    request = ask.request
    repo, revision = request.repo, request.revision
    name = ask.name or request.default_name()
    check_model_name(name)
    for alias in ask.aliases:
        check_model_name(alias)
    located = located_files(home, request, say, "pulling")
    store = open_authority(home)
    try:
        existing = store.resolve_service(name)
    finally:
        store.close()
    if existing is not None:
        if _same_pull(existing.origin, located):
            say(
                f"model [bold]{existing.name}[/bold] is already "
                f"{repo}@{located.snapshot.commit[:12]}; nothing changed"
            )
            return None
        raise Refused(
            f"model {name!r} already exists; choose another name with --name. Nothing changed."
        )
    model_files = located.model
    say(
        f"{repo}@{revision} is commit {located.snapshot.commit}: {model_files.label} "
        f"({model_files.size / 1e6:.1f} MB, {len(model_files.parts)} file(s)) "
        f"from {located.snapshot.where}",
        err=True,
    )
    try:
        with fetched(located, home.downloads, progress) as path:
            svc = admit_gguf(
                home,
                identity,
                say,
                name,
                path,
                ask.aliases,
                ask.engine,
                ask.no_serve,
                ask.where,
                origin=located.origin(),
                actor=actor,
            )
    except ChecksumMismatch as exc:
        audit_denied(home, actor, "model.pull", f"{repo}@{located.snapshot.commit}", str(exc))
        raise Refused(f"{exc}. Nothing changed.") from exc
    except (HubError, SplitError, StoreError) as exc:
        raise Refused(f"{exc}. Nothing changed.") from exc
    except OSError as exc:  # a full disk, a folder it may not write
        raise Refused(
            f"cannot write the download under {home.downloads} ({exc}). Nothing changed."
        ) from exc
    say(f"  repo     {repo}")
    say(f"  commit   {located.snapshot.commit}")
    say(f"  sha256   {svc.artifact_digest}")
    return svc
