"""What every admin route module is built with."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends

from letsinfer.control.ops.roles import Role, actor_of, nothing_to_apply, role_check
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.store import AuthorityStore
from letsinfer.trust.peer import Peer


@dataclass
class OpsContext:
    store: AuthorityStore
    identity: NodeIdentity
    # Runs after each mutation: the node applies it at once, not at its next reconcile.
    on_change: Callable[[], Awaitable[None]] = nothing_to_apply
    # The main's home: its request records and its signed audit head. None
    # where only the authority is at hand: those routes answer 503.
    home: Home | None = None

    def need(self, role: Role) -> Any:
        """A route parameter's dependency: the caller, within ``role``."""
        return Depends(role_check(self.store, role))

    def actor(self, p: Peer) -> str:
        return actor_of(self.store, p)
