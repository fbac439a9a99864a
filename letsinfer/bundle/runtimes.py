"""An imported bundle's runtimes: installed from the mirror, released on the main.

A trusted key vouched for a bundle's runtimes (its manifest). After an import,
each llama-server binary is installed from the mirror's verified blob to
``<var>/runtimes/<sha256>/llama-server`` (read-only, executable; the same path
on every node with the default home), so an air-gapped node runs the bundled
build. On the main, each runtime also becomes a runtime release in the
authority, signed with the cluster's release key like every release the main
makes and bound to bytes the same way: a llama-server release to the
installed binary's path and sha256 (engines/releases.py ``llama_server``), an
xllamacpp release to its wheel's package digest, the one the node's package
has once installed from the bundle's wheelhouse.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from letsinfer.bundle.archive import BundleError
from letsinfer.bundle.manifest import BundleRuntime, Manifest
from letsinfer.engines import package, releases
from letsinfer.engines.binary import BinaryError, BinaryIdentity, identify, sha256_of
from letsinfer.engines.releases import Release
from letsinfer.home import Home
from letsinfer.mirror.layout import MirrorLayout
from letsinfer.release import runtime
from letsinfer.store import AuthorityStore


def runtime_binary(home: Home, digest: str) -> Path:
    return home.var / "runtimes" / digest / "llama-server"


def _install_binary(home: Home, blob: Path, digest: str) -> Path:
    """The blob's bytes as an executable at a path named by its digest."""
    dest = runtime_binary(home, digest)
    if dest.is_file() and sha256_of(dest) == digest:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part")
    shutil.copyfile(blob, part)
    if sha256_of(part) != digest:  # the mirror's blob is read-only; this is a last look
        part.unlink()
        raise BundleError(f"the mirror's copy of {digest} does not match its sha256")
    part.chmod(0o555)
    os.replace(part, dest)
    return dest


def _release(home: Home, layout: MirrorLayout, r: BundleRuntime) -> Release:
    if r.engine == "llama-server":
        digest = r.artifacts[releases.LLAMA_SERVER_ARTIFACT]
        binary = _install_binary(home, layout.blob(digest), digest)
        try:
            identity = identify(str(binary))
        except BinaryError:
            # A build for another target may not run here (no GPU libraries):
            # its bytes still name it.
            identity = BinaryIdentity(str(binary), digest, "unknown (no --version answer here)")
        made = releases.llama_server(identity, r.target)
    elif r.engine == "xllamacpp":
        made = releases.xllamacpp_release(
            r.version, package.wheel_digest(layout.blob(r.artifacts["wheel"]))
        )
    else:
        raise BundleError(f"runtime {r.id}: engine {r.engine!r} cannot be installed from a bundle")
    return made


@dataclass(frozen=True)
class Installed:
    releases: list[Release]
    registered: list[str]  # ids new to the authority (on the main)


def install_runtimes(
    home: Home, manifest: Manifest, store: AuthorityStore | None, bundle_id: str
) -> Installed:
    """Install the bundle's runtimes; with the main's ``store``, release them there."""
    layout = MirrorLayout.for_home(home)
    try:
        made = [_release(home, layout, r) for r in manifest.runtimes]
    except (BinaryError, OSError) as exc:
        raise BundleError(f"cannot install the bundle's runtimes ({exc})") from exc
    registered: list[str] = []
    if store is not None:
        with store.transaction():
            for r in made:
                if store.get_release(r.id) is not None:
                    continue
                signature = runtime.sign(home, r)
                store.ensure_release(
                    r.id, r.engine, r.version, r.target, r.artifacts, r.launch, signature
                )
                store.append_audit(
                    "cli",
                    "release.add",
                    "ok",
                    target=r.id,
                    detail=f"from bundle {bundle_id}: {r.engine} {r.version} {r.target}",
                )
                registered.append(r.id)
    return Installed(made, registered)
