"""`model update`'s download: a pulled model's repository resolved again at a
revision, its new weights downloaded, verified and put in the model store, as
`model pull` does. The same function for the CLI on the main and for a
controller (the admin API), so both say the same; the rollout follows on the
main's loop (letsinfer.lifecycle.weight_routes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from letsinfer.admission.gguf import Refused
from letsinfer.admission.pull import audit_denied, located_files
from letsinfer.admission.said import Say
from letsinfer.audit.anchor import open_authority
from letsinfer.bundle.progress import Progress
from letsinfer.home import Home


class NoSuchModel(Refused):
    """There is no model by that name (a controller is answered 404)."""


@dataclass(frozen=True)
class Fetched:
    """The new weights, in the model store (``sha256`` None: the model runs
    this commit's files already; nothing was downloaded)."""

    model: str
    repo: str
    commit: str
    sha256: str | None = None
    size: int = 0
    origin: dict[str, Any] | None = None


def fetch_update(
    home: Home, say: Say, progress: Progress, name: str, revision: str | None, actor: str = "cli"
) -> Fetched:
    """Refused (nothing changed) when the model has no origin to update
    from, the revision cannot be resolved, or the bytes are not the ones
    published."""
    from letsinfer.authority.modelstore import stage_gguf
    from letsinfer.contracts.artifacts import ModelFileError
    from letsinfer.hub.client import HubError
    from letsinfer.hub.pull import PullRequest, fetched
    from letsinfer.hub.sources import ChecksumMismatch
    from letsinfer.hub.splits import SplitError

    store = open_authority(home)
    try:
        svc = store.resolve_service(name)
    finally:
        store.close()
    if svc is None:
        raise NoSuchModel(f"no model {name!r} (see `letsinfer model list`)")
    origin = svc.origin
    if not origin or not origin.get("files"):
        raise Refused(
            f"model {svc.name} has no recorded origin (it was added from a file, not pulled): "
            "nothing to update it from. Nothing changed."
        )
    request = PullRequest(
        repo=origin["repo"],
        revision=revision or origin.get("revision") or "main",
        file=origin["files"][0]["name"],
    )
    located = located_files(home, request, say, "updating")
    commit = located.snapshot.commit
    sha256s = [p.sha256 for p in located.model.parts]
    if commit == origin.get("commit") and sha256s == [f["sha256"] for f in origin["files"]]:
        return Fetched(svc.name, request.repo, commit)
    say(
        f"{request.repo}@{request.revision} is commit {commit}: {located.model.label} "
        f"({located.model.size / 1e6:.1f} MB) from {located.snapshot.where}",
        err=True,
    )
    try:
        with fetched(located, home.downloads, progress) as path:
            staged = stage_gguf(home.model_store, path)
            if staged.kind != svc.kind:
                staged.discard()
                raise Refused(
                    f"{request.repo}@{commit[:12]} is an {staged.kind} model; {svc.name} "
                    f"serves {svc.kind}s. Nothing changed."
                )
            artifact = staged.commit()
    except ChecksumMismatch as exc:
        audit_denied(home, actor, "model.update", f"{request.repo}@{commit}", str(exc))
        raise Refused(f"{exc}. Nothing changed.") from exc
    except (HubError, SplitError, ModelFileError) as exc:
        raise Refused(f"{exc}. Nothing changed.") from exc
    except OSError as exc:
        raise Refused(
            f"cannot write the download under {home.downloads} ({exc}). Nothing changed."
        ) from exc
    return Fetched(svc.name, request.repo, commit, artifact.digest, artifact.size, located.origin())
