"""Whether a peer's data address is reached directly (on-link, no gateway).

Asked of the kernel with pyroute2 (``RTM_GETROUTE`` for the address, as
``ip route get`` does), never by parsing command output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute

from letsinfer.links.proof import LinkProofError

_RTN_UNICAST = 1


@dataclass(frozen=True)
class Route:
    address: str
    kind: int  # rtm type: 1 unicast, 2 local, ...
    gateway: str | None
    interface: str | None
    source: str | None


def judge(route: Route) -> str:
    """The interface a direct route uses, or LinkProofError saying why it is not direct."""
    if route.kind != _RTN_UNICAST:
        raise LinkProofError(
            f"{route.address} is not a remote unicast address here (route type {route.kind})"
        )
    if route.gateway:
        raise LinkProofError(
            f"the route to {route.address} goes through gateway {route.gateway}, not on-link"
        )
    if not route.interface:
        raise LinkProofError(f"the route to {route.address} names no interface")
    return route.interface


def _route(msg: Any, address: str, names: dict[int, str]) -> Route:
    oif = msg.get_attr("RTA_OIF")
    return Route(
        address=address,
        kind=int(msg["type"]),
        gateway=msg.get_attr("RTA_GATEWAY"),
        interface=names.get(oif) if oif is not None else None,
        source=msg.get_attr("RTA_PREFSRC"),
    )


def route_to(address: str, netns: str | None = None) -> Route:
    """The kernel's route to ``address`` (in this process's namespace by default)."""
    with IPRoute(netns=netns) if netns else IPRoute() as ipr:
        try:
            found = ipr.route("get", dst=address)
        except Exception as exc:  # pyroute2 raises NetlinkError (unreachable) and others
            raise LinkProofError(f"no route to {address}: {exc}") from exc
        names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
    if not found:
        raise LinkProofError(f"no route to {address}")
    return _route(found[0], address, names)


def require_direct(address: str, netns: str | None = None) -> str:
    return judge(route_to(address, netns))
