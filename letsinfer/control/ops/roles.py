"""Who asks, and whether their role allows an operation: one check for every
admin route (the control plane's controllers, the admin socket's local
administrators). A refusal is audited under the caller's identity."""

from collections.abc import Awaitable, Callable
from typing import Literal

from fastapi import HTTPException, Request

from letsinfer.authority import controllers
from letsinfer.store import AuthorityStore
from letsinfer.trust.peer import Peer, gated_peer

Role = Literal["viewer", "operator", "administrator"]


def actor_of(store: AuthorityStore, p: Peer) -> str:
    """How the audit chain names a peer."""
    if p.identity.kind == "controller":
        rec = store.get_controller(p.identity.id)
        return f"controller:{rec.name if rec else p.identity.id}"
    return f"{p.identity.kind}:{p.identity.id}"


async def nothing_to_apply() -> None:
    return None


def role_check(store: AuthorityStore, role: Role) -> Callable[[Request], Awaitable[Peer]]:
    """A dependency: the caller, if its role is at least ``role``; else 403,
    audited as denied with the path asked for."""

    async def check(request: Request) -> Peer:
        p = gated_peer(request)
        if not controllers.allows(p.identity.role, role):
            store.append_audit(
                actor_of(store, p),
                request.url.path,
                "denied",
                role=p.identity.role,
                detail=f"needs {role}",
            )
            raise HTTPException(
                403,
                f"this operation needs the {role} role; this controller is {p.identity.role}",
            )
        return p

    check.role = role  # type: ignore[attr-defined]  # (the OpenAPI document names it)
    return check
