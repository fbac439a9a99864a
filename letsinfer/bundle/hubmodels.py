"""``bundle create --model REPO@REV[:FILE|:QUANT]``: models taken from the hub, with
their origin, so that ``model pull`` finds them in an air-gapped node's mirror.

The revision is resolved to a commit and the files are downloaded and checked
against the sha256 the hub publishes before they go into the bundle. Without
``:FILE`` or ``:QUANT`` every GGUF model of the repository at that commit goes in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from letsinfer import config
from letsinfer.bundle.archive import BundleError
from letsinfer.bundle.manifest import BundleModel, ModelSource, ModelSourceFile
from letsinfer.bundle.progress import Progress
from letsinfer.fetch import FetchPolicy
from letsinfer.home import Home
from letsinfer.hub.choice import ChoiceError, ModelFiles, choose, gguf_models
from letsinfer.hub.client import HubClient, HubError, Snapshot, read_token
from letsinfer.hub.sources import HubSource

_SPEC = re.compile(r"^(?P<repo>[^@:=\s]+)@(?P<rev>[^:\s]+)(?::(?P<pick>\S+))?$")


def is_hub_spec(spec: str) -> bool:
    return "=" not in spec and _SPEC.fullmatch(spec) is not None and not Path(spec).exists()


@dataclass(frozen=True)
class HubModels:
    spec: str
    snapshot: Snapshot
    models: tuple[ModelFiles, ...]

    def folder(self) -> str:
        return f"models/{self.snapshot.repo.replace('/', '_')}/{self.snapshot.commit[:12]}"


def resolve_hub_models(home: Home, spec: str) -> tuple[HubModels, HubSource]:
    """Resolve the spec against the configured hub (no download yet)."""
    m = _SPEC.fullmatch(spec)
    assert m is not None
    node_settings = config.load(home.config_file)
    settings = node_settings.hub
    if not settings.enabled:
        raise BundleError(f"--model {spec}: the hub is off ([hub] enabled = false)")
    try:
        client = HubClient(
            settings.endpoint,
            read_token(settings.token_file),
            settings.timeout_s,
            FetchPolicy.from_settings(node_settings),
        )
        snapshot = client.resolve(m["repo"], m["rev"])
        pick = m["pick"]
        if pick is None:
            found = gguf_models(snapshot.files)
            models = tuple(
                choose(snapshot.repo, snapshot.files, file=f.parts[0].name) for f in found
            )
            if not models:
                raise ChoiceError(f"{snapshot.repo} has no GGUF file")
        elif pick.lower().endswith(".gguf"):
            models = (choose(snapshot.repo, snapshot.files, file=pick),)
        else:
            models = (choose(snapshot.repo, snapshot.files, quant=pick),)
    except (HubError, ChoiceError) as exc:
        raise BundleError(f"--model {spec}: {exc}") from exc
    return HubModels(spec, snapshot, models), HubSource(client, home.downloads)


def fetch_hub_models(
    chosen: HubModels,
    source: HubSource,
    work: Path,
    progress: Progress,
    add_file: Callable[[str, Path, str], None],
) -> list[BundleModel]:
    """Download and verify every part into ``work``; add each as a bundle file."""
    source = HubSource(source.client, work / "hub-downloads")
    out = []
    s = chosen.snapshot
    for model in chosen.models:
        files = []
        for part in model.parts:
            try:
                path = source.fetch(s, part, progress)
            except HubError as exc:
                raise BundleError(f"--model {chosen.spec}: {exc}") from exc
            bundle_path = f"{chosen.folder()}/{part.name}"
            add_file(bundle_path, path, "model")
            files.append(ModelSourceFile(name=part.name, path=bundle_path))
        stem = re.sub(r"(-\*-of-\d{5})?\.gguf$", "", model.label).rpartition("/")[2]
        out.append(
            BundleModel(
                name=f"{s.repo}:{stem}",
                path=files[0].path,
                source=ModelSource(
                    repo=s.repo, revision=s.revision, commit=s.commit, files=tuple(files)
                ),
            )
        )
    return out
