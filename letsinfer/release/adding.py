"""`release add`: a signed runtime release of a llama-server binary as it is
now (its path and sha256), recorded once. One function for the CLI on the
main and the admin API, so both record and say it alike."""

from __future__ import annotations

from dataclasses import dataclass

from letsinfer.engines import releases
from letsinfer.engines.binary import identify
from letsinfer.home import Home
from letsinfer.release import runtime
from letsinfer.store import AuthorityStore


@dataclass(frozen=True)
class AddedRelease:
    release: str
    existed: bool  # recorded before: nothing changed
    binary: str
    sha256: str
    version: str

    def lines(self) -> list[str]:
        """What `release add` prints."""
        return [
            f"{'release exists' if self.existed else 'release added'}: {self.release}",
            f"  binary {self.binary}  sha256 {self.sha256}",
            f"  version {self.version}",
        ]


def add_runtime_release(
    home: Home,
    store: AuthorityStore,
    binary: str,
    target: str,
    *,
    actor: str = "cli",
    role: str | None = None,
) -> AddedRelease:
    """BinaryError (its path, bytes or --version refused): nothing changed."""
    made = releases.llama_server(identify(binary), target)
    digest = made.artifacts[releases.LLAMA_SERVER_ARTIFACT]
    known = store.get_release(made.id) is not None
    with store.transaction():
        store.ensure_release(
            made.id,
            made.engine,
            made.version,
            made.target,
            made.artifacts,
            made.launch,
            runtime.sign(home, made),
        )
        if not known:
            store.append_audit(
                actor,
                "release.add",
                "ok",
                role=role,
                target=made.id,
                detail=f"{made.launch['binary']} sha256:{digest}",
            )
    return AddedRelease(made.id, known, str(made.launch["binary"]), digest, made.version)
