"""Resolving a URL's host to the addresses a connection would reach, each checked.

Both ``check_url`` (at the time an operator gives a URL) and the guarded
clients' connections (every time one is opened) come here, so the two can
never disagree about what is allowed.
"""

from __future__ import annotations

import ipaddress
import socket

import anyio
import httpx

from letsinfer.fetch.policy import FetchPolicy, FetchRefused, IPAddress, check_address

SCHEMES = ("http", "https")


def shown(url: httpx.URL) -> str:
    """``url`` fit for a message: no credentials, query or fragment (a signed
    download link carries its signature there)."""
    if url.userinfo:
        url = url.copy_with(userinfo=b"")
    if url.query or url.fragment:
        url = url.copy_with(query=None, fragment=None)
    return str(url)


def literal_address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _addresses(infos: list[tuple]) -> list[IPAddress]:
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(sockaddr[0])
        if address not in found:
            found.append(address)
    return found


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (``socket.gaierror`` when none)."""
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    return _addresses(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))


async def resolve_async(host: str, port: int) -> list[IPAddress]:
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    return _addresses(await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM))


def check_addresses(addresses: list[IPAddress], policy: FetchPolicy, target: str) -> None:
    # Every address, not just the first: which one a connection gets is the
    # resolver's choice, and a name may mix a public address with a private one.
    for address in addresses:
        check_address(address, policy, target)


def parse(url: str) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise FetchRefused(f"refused to fetch that URL: it is not one ({exc})") from None
    if parsed.scheme not in SCHEMES:
        raise FetchRefused(
            f"refused to fetch {shown(parsed)!r}: only http and https URLs are fetched "
            f"(got {parsed.scheme or 'no scheme'!r})"
        )
    if not parsed.host:
        raise FetchRefused(f"refused to fetch {shown(parsed)!r}: the URL names no host")
    return parsed


def default_port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def check_proxied(host: str, port: int, policy: FetchPolicy, target: str) -> None:
    """A destination reached through the operator's proxy: the proxy resolves
    the name and connects, so this machine checks what it can know. A literal
    address, or a name that resolves here, is checked as without a proxy (a
    proxy must not become a way to reach this machine or its LAN); a name that
    does not resolve here is the proxy's to resolve (its egress rules apply)."""
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError):
        return
    check_addresses(addresses, policy, target)


async def check_proxied_async(host: str, port: int, policy: FetchPolicy, target: str) -> None:
    try:
        addresses = await resolve_async(host, port)
    except (OSError, UnicodeError):
        return
    check_addresses(addresses, policy, target)


def check_url(url: str, policy: FetchPolicy) -> None:
    """Refuse (``FetchRefused``) a URL that is not http(s), whose host does not
    resolve (unless a proxy is to resolve it), or any of whose addresses is
    non-global and not allowed."""
    parsed = parse(url)
    if policy.proxy_for(parsed.scheme, parsed.host) is not None:
        check_proxied(parsed.host, default_port(parsed), policy, shown(parsed))
        return
    try:
        addresses = resolve(parsed.host, default_port(parsed))
    except (socket.gaierror, UnicodeError) as exc:
        raise FetchRefused(
            f"refused to fetch {shown(parsed)}: cannot resolve {parsed.host} ({exc})"
        ) from None
    check_addresses(addresses, policy, shown(parsed))


def address_refusal(url: str, policy: FetchPolicy) -> str | None:
    """Why ``url`` (already known to be http(s)) may not be fetched now, by the
    addresses its host has; ``None`` when they are allowed, or when the name
    does not resolve now (that is not a refusal: the connection fails on its own)."""
    parsed = parse(url)
    try:
        addresses = resolve(parsed.host, default_port(parsed))
    except (OSError, UnicodeError):
        return None
    try:
        check_addresses(addresses, policy, shown(parsed))
    except FetchRefused as exc:
        return str(exc)
    return None


def redirect_refusal(source: httpx.URL, target: httpx.URL, policy: FetchPolicy) -> str | None:
    """Why a redirect from ``source`` to ``target`` is not followed (``None``: it is)."""
    if target.scheme not in SCHEMES:
        return (
            f"refused to follow the redirect from {source.host} to {shown(target)}: "
            "only http and https URLs are fetched"
        )
    if target.host.lower() == source.host.lower() or policy.allows_redirect_to(target.host):
        return None
    return (
        f"refused to follow the redirect from {source.host} to {shown(target)}: "
        f"redirects are followed only within {source.host}"
    )
