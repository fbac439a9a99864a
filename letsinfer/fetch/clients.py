"""httpx clients that check every connection's destination and every redirect.

Why a network backend: httpcore asks its network backend for each new TCP
connection with the URL's host name. The guarded backend resolves that name
once, checks every address it got, and then connects to one of those checked
addresses itself, so there is no second lookup a rebinding DNS server could
answer differently between the check and the connect. TLS is unaffected:
httpcore still verifies the certificate against (and sends SNI for) the URL's
host name, not the address. Redirect hops go through the same backend, so each
hop's addresses are checked too; which hosts a redirect may go to is checked
before its request is sent.

Through a proxy (``[fetch] proxy``, else the environment's HTTPS_PROXY,
HTTP_PROXY and NO_PROXY) the connection goes to the proxy the operator named,
and the destination is checked before the request is sent: a literal address
or a name that resolves here as without a proxy; a name only the proxy can
resolve is left to the proxy's own egress rules (``check_proxied``). The
clients' own ``proxy=`` and ``mounts=`` are still refused: the policy says
which proxy, so no caller can route around the check.

The same classes are built for huggingface_hub's copy of httpx (httpx2 over
httpcore2, the same code under other names): ``guarded_kit`` takes the pair.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass

import httpcore
import httpx

from letsinfer.fetch.destinations import (
    check_addresses,
    check_proxied,
    check_proxied_async,
    default_port,
    redirect_refusal,
    resolve,
    resolve_async,
)
from letsinfer.fetch.policy import FetchPolicy, FetchRefused

# A redirect found not to be followed is marked on the request httpx builds for
# it; the transport refuses that request before sending it. (httpx builds the
# redirect request even when it is not going to follow it, so refusing there
# would break callers that read a redirect themselves.)
_REFUSED_REDIRECT = "letsinfer.refused_redirect"

_TRANSPORT_OPTIONS = ("verify", "cert", "trust_env", "http1", "http2", "limits")
_NOT_ALLOWED = ("transport", "mounts", "proxy", "app")


def _target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class GuardedKit:
    """Guarded client classes for one httpx-like library."""

    client: type
    async_client: type
    transport: type
    async_transport: type

    def split(self, httpx_kwargs: dict[str, typing.Any]) -> tuple[dict, dict]:
        for name in _NOT_ALLOWED:
            if name in httpx_kwargs:
                raise TypeError(
                    f"a guarded client makes its own connections: {name}= is not accepted"
                )
        transport = {k: v for k, v in httpx_kwargs.items() if k in _TRANSPORT_OPTIONS}
        client = {k: v for k, v in httpx_kwargs.items() if k not in _TRANSPORT_OPTIONS}
        if "trust_env" in transport:
            client["trust_env"] = transport["trust_env"]
        return transport, client

    def make_client(self, policy: FetchPolicy, **httpx_kwargs: typing.Any) -> typing.Any:
        transport, client = self.split(httpx_kwargs)
        return self.client(policy, transport=self.transport(policy, transport), **client)

    def make_async_client(self, policy: FetchPolicy, **httpx_kwargs: typing.Any) -> typing.Any:
        transport, client = self.split(httpx_kwargs)
        return self.async_client(
            policy, transport=self.async_transport(policy, transport), **client
        )


def guarded_kit(http: types.ModuleType, core: types.ModuleType) -> GuardedKit:
    """The guarded classes for the library ``http`` (httpx) over ``core`` (httpcore)."""

    def unresolved(host: str, exc: Exception) -> Exception:
        # A name that does not resolve is an unreachable host, as without the guard.
        return core.ConnectError(f"cannot resolve {host}: {exc}")

    class Backend(core.NetworkBackend):  # type: ignore[misc, name-defined]
        def __init__(self, policy: FetchPolicy) -> None:
            self._policy = policy
            self._inner = core.SyncBackend()

        def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: typing.Any = None,
        ) -> typing.Any:
            try:
                addresses = resolve(host, port)
            except (OSError, UnicodeError) as exc:
                raise unresolved(host, exc) from exc
            check_addresses(addresses, self._policy, _target(host, port))
            error: Exception | None = None
            for address in addresses:  # only these: the ones just checked
                try:
                    return self._inner.connect_tcp(
                        str(address), port, timeout, local_address, socket_options
                    )
                except core.ConnectError as exc:
                    error = exc
            assert error is not None  # resolve() gives at least one address
            raise error

        def connect_unix_socket(self, path: str, *args: typing.Any, **kw: typing.Any) -> None:
            raise FetchRefused(f"refused to fetch through the unix socket {path}")

        def sleep(self, seconds: float) -> None:
            self._inner.sleep(seconds)

    class AsyncBackend(core.AsyncNetworkBackend):  # type: ignore[misc, name-defined]
        def __init__(self, policy: FetchPolicy) -> None:
            self._policy = policy
            self._inner = core.AnyIOBackend()

        async def connect_tcp(
            self,
            host: str,
            port: int,
            timeout: float | None = None,
            local_address: str | None = None,
            socket_options: typing.Any = None,
        ) -> typing.Any:
            try:
                addresses = await resolve_async(host, port)
            except (OSError, UnicodeError) as exc:
                raise unresolved(host, exc) from exc
            check_addresses(addresses, self._policy, _target(host, port))
            error: Exception | None = None
            for address in addresses:
                try:
                    return await self._inner.connect_tcp(
                        str(address), port, timeout, local_address, socket_options
                    )
                except core.ConnectError as exc:
                    error = exc
            assert error is not None
            raise error

        async def connect_unix_socket(self, path: str, *args: typing.Any, **kw: typing.Any) -> None:
            raise FetchRefused(f"refused to fetch through the unix socket {path}")

        async def sleep(self, seconds: float) -> None:
            await self._inner.sleep(seconds)

    def pool_options(options: dict[str, typing.Any]) -> dict[str, typing.Any]:
        limits = options.get("limits", http.Limits())
        return {
            "ssl_context": http.create_ssl_context(
                verify=options.get("verify", True),
                cert=options.get("cert"),
                trust_env=options.get("trust_env", True),
            ),
            "max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry,
            "http1": options.get("http1", True),
            "http2": options.get("http2", False),
        }

    def proxy_options(options: dict[str, typing.Any]) -> dict[str, typing.Any]:
        # The proxy is the operator's: httpx's own proxy transport, nothing
        # else taken from the environment.
        kept = {k: v for k, v in options.items() if k != "trust_env"}
        return {**kept, "trust_env": False}

    def proxied(request: typing.Any, policy: FetchPolicy) -> tuple[str, str, int] | None:
        url = request.url
        proxy = policy.proxy_for(url.scheme, url.host)
        if proxy is None:
            return None
        return proxy, url.host, default_port(httpx.URL(str(url)))

    class Transport(http.HTTPTransport):  # type: ignore[misc, name-defined]
        # httpx's transport builds its httpcore pool with the default network
        # backend and has no setting for another; this one builds the same
        # pool with the guarded backend and keeps httpx's request handling.
        def __init__(self, policy: FetchPolicy, options: dict[str, typing.Any]) -> None:
            self._policy = policy
            self._options = options
            self._through: dict[str, typing.Any] = {}  # proxy URL -> its transport
            self._pool = core.ConnectionPool(
                **pool_options(options), network_backend=Backend(policy)
            )

        def handle_request(self, request: typing.Any) -> typing.Any:
            refusal = request.extensions.get(_REFUSED_REDIRECT)
            if refusal:
                raise FetchRefused(refusal)
            via = proxied(request, self._policy)
            if via is None:
                return super().handle_request(request)
            proxy, host, port = via
            check_proxied(host, port, self._policy, _target(host, port))
            if proxy not in self._through:
                self._through[proxy] = http.HTTPTransport(
                    proxy=proxy, **proxy_options(self._options)
                )
            return self._through[proxy].handle_request(request)

        def close(self) -> None:
            for transport in self._through.values():
                transport.close()
            super().close()

    class AsyncTransport(http.AsyncHTTPTransport):  # type: ignore[misc, name-defined]
        def __init__(self, policy: FetchPolicy, options: dict[str, typing.Any]) -> None:
            self._policy = policy
            self._options = options
            self._through: dict[str, typing.Any] = {}
            self._pool = core.AsyncConnectionPool(
                **pool_options(options), network_backend=AsyncBackend(policy)
            )

        async def handle_async_request(self, request: typing.Any) -> typing.Any:
            refusal = request.extensions.get(_REFUSED_REDIRECT)
            if refusal:
                raise FetchRefused(refusal)
            via = proxied(request, self._policy)
            if via is None:
                return await super().handle_async_request(request)
            proxy, host, port = via
            await check_proxied_async(host, port, self._policy, _target(host, port))
            if proxy not in self._through:
                self._through[proxy] = http.AsyncHTTPTransport(
                    proxy=proxy, **proxy_options(self._options)
                )
            return await self._through[proxy].handle_async_request(request)

        async def aclose(self) -> None:
            for transport in self._through.values():
                await transport.aclose()
            await super().aclose()

    def mark(request: typing.Any, redirect: typing.Any, policy: FetchPolicy) -> typing.Any:
        refusal = redirect_refusal(
            httpx.URL(str(request.url)), httpx.URL(str(redirect.url)), policy
        )
        if refusal:
            redirect.extensions = {**redirect.extensions, _REFUSED_REDIRECT: refusal}
        return redirect

    class Client(http.Client):  # type: ignore[misc, name-defined]
        def __init__(self, policy: FetchPolicy, **kwargs: typing.Any) -> None:
            super().__init__(**kwargs)
            self._fetch_policy = policy

        def _build_redirect_request(self, request: typing.Any, response: typing.Any) -> typing.Any:
            redirect = super()._build_redirect_request(request, response)
            return mark(request, redirect, self._fetch_policy)

    class AsyncClient(http.AsyncClient):  # type: ignore[misc, name-defined]
        def __init__(self, policy: FetchPolicy, **kwargs: typing.Any) -> None:
            super().__init__(**kwargs)
            self._fetch_policy = policy

        def _build_redirect_request(self, request: typing.Any, response: typing.Any) -> typing.Any:
            redirect = super()._build_redirect_request(request, response)
            return mark(request, redirect, self._fetch_policy)

    return GuardedKit(Client, AsyncClient, Transport, AsyncTransport)


_HTTPX = guarded_kit(httpx, httpcore)


def guarded_client(policy: FetchPolicy, **httpx_kwargs: typing.Any) -> httpx.Client:
    """An ``httpx.Client`` (same keyword arguments, less transport, mounts and
    proxy) whose every connection and redirect is checked against ``policy``;
    a refusal raises ``FetchRefused`` before anything is sent there."""
    return typing.cast(httpx.Client, _HTTPX.make_client(policy, **httpx_kwargs))


def guarded_async_client(policy: FetchPolicy, **httpx_kwargs: typing.Any) -> httpx.AsyncClient:
    """The ``httpx.AsyncClient`` counterpart of ``guarded_client``."""
    return typing.cast(httpx.AsyncClient, _HTTPX.make_async_client(policy, **httpx_kwargs))
