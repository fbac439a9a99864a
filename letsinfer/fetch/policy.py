"""Which addresses a URL an operator gave may reach, and the refusal when not.

Only global unicast addresses are reachable by default: a URL pointing at this
machine, the LAN, a cloud's metadata service or any other non-global address
is refused unless the operator lists its network in ``[fetch] allow_networks``.
"""

from __future__ import annotations

import ipaddress
import urllib.request
from dataclasses import dataclass
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SETTING = "[fetch] allow_networks"
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_METADATA = ipaddress.ip_address("169.254.169.254")


class FetchRefused(Exception):
    """A URL (or one of its redirects) would reach an address or host not allowed;
    the message names the address or host, and the setting that allows it."""


@dataclass(frozen=True)
class FetchPolicy:
    allow_networks: tuple[IPNetwork, ...] = ()
    allow_redirect_hosts: tuple[str, ...] = ()
    # The operator's HTTP proxy ([fetch] proxy); None: the environment's
    # HTTPS_PROXY / HTTP_PROXY / NO_PROXY, as other tools read them.
    proxy: str | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> FetchPolicy:
        """The node's policy: ``settings`` is the loaded ``letsinfer.config.Settings``."""
        return cls(
            allow_networks=tuple(
                ipaddress.ip_network(network, strict=False)
                for network in settings.fetch.allow_networks
            ),
            proxy=settings.fetch.proxy or None,
        )

    def proxy_for(self, scheme: str, host: str) -> str | None:
        """The proxy a fetch of ``scheme://host`` goes through, if any."""
        if self.proxy is not None:
            return self.proxy
        found = urllib.request.getproxies_environment()
        proxy = found.get(scheme)
        if not proxy or urllib.request.proxy_bypass_environment(host, found):
            return None
        return proxy

    def allows_redirect_to(self, host: str) -> bool:
        """Whether a redirect to ``host`` (another host) is followed: an entry
        ``cdn.example.org`` allows that host, ``.example.org`` it and every host under it."""
        wanted = host.lower().rstrip(".")
        for allowed in self.allow_redirect_hosts:
            allowed = allowed.lower().rstrip(".")
            if allowed.startswith("."):
                if wanted == allowed[1:] or wanted.endswith(allowed):
                    return True
            elif wanted == allowed:
                return True
        return False


def non_global_kind(address: IPAddress) -> str | None:
    """What makes ``address`` non-global (``None`` for a global unicast address).

    An IPv4-mapped IPv6 address is judged as the IPv4 address it carries: the
    kernel connects to that one (and Python 3.11's own flags miss it).
    """
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address == _METADATA:
        return "link-local (cloud metadata)"
    # Order matters: the most telling name first (127.0.0.1 is private too).
    for kind, flag in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
    ):
        if flag:
            return kind
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return "shared (carrier-grade NAT)"
    if not address.is_global:
        return "non-global"
    return None


def _allowed(address: IPAddress, policy: FetchPolicy) -> bool:
    candidates: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        candidates.append(address.ipv4_mapped)
    return any(
        candidate.version == network.version and candidate in network
        for candidate in candidates
        for network in policy.allow_networks
    )


def check_address(address: IPAddress, policy: FetchPolicy, target: str) -> None:
    """Raise ``FetchRefused`` when ``address`` (which ``target`` reaches) is not allowed."""
    kind = non_global_kind(address)
    if kind is None or _allowed(address, policy):
        return
    shown, network = str(address), f"{address}/{32 if address.version == 4 else 128}"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # Allowing the IPv4 address it carries allows it too (see _allowed).
        shown, network = f"::ffff:{address.ipv4_mapped}", f"{address.ipv4_mapped}/32"
    article = "an" if kind[0] in "aeiou" else "a"
    raise FetchRefused(
        f"refused to fetch {target}: {shown} is {article} {kind} address; "
        f'to allow it, list its network in {SETTING} (e.g. ["{network}"])'
    )
