"""What every admin route module is built with."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends

from letsinfer import config
from letsinfer.authority.removal import Removal
from letsinfer.control.ops.roles import Role, actor_of, nothing_to_apply, role_check
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.store import AuthorityStore
from letsinfer.trust.peer import Peer

# The running node's exposure state once it served <etc>/exposure.json anew.
ApplyExposure = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class OpsContext:
    store: AuthorityStore
    identity: NodeIdentity
    # Runs after each mutation: the node applies it at once, not at its next reconcile.
    on_change: Callable[[], Awaitable[None]] = nothing_to_apply
    # The main's home: its request records and its signed audit head. None
    # where only the authority is at hand: those routes answer 503.
    home: Home | None = None
    # After a node's removal committed: the running node stops routing to its
    # groups and tells it (what it said); None: no node runs here (503).
    on_removed: Callable[[Removal], Awaitable[dict[str, Any]]] | None = None
    # After `exposure enable/disable` changed <etc>/exposure.json: the running
    # node serves it (ExposureRunner.apply on the gateway's loop: its state,
    # `error` set when it could not); None: no node runs here (served at its
    # next start).
    apply_exposure: "ApplyExposure | None" = None

    def settings(self) -> config.Settings:
        """The main's settings (the defaults where no home is at hand)."""
        if self.home is None:
            return config.Settings()
        try:
            return config.load(self.home.config_file)
        except config.ConfigError:
            return config.Settings()

    def need(self, role: Role) -> Any:
        """A route parameter's dependency: the caller, within ``role``."""
        return Depends(role_check(self.store, role))

    def actor(self, p: Peer) -> str:
        return actor_of(self.store, p)
