"""Fetching through the operator's HTTP proxy ([fetch] proxy, or the
environment's HTTP_PROXY / HTTPS_PROXY / NO_PROXY): the request goes to the
proxy, and the destination is still checked here before anything is sent — a
proxy is not a way around [fetch] allow_networks."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from letsinfer import config
from letsinfer.fetch import FetchPolicy, FetchRefused, check_url, guarded_client
from letsinfer.fetch.clients import guarded_async_client
from letsinfer.fetch.policy import SETTING

# A name this machine cannot resolve (.example is reserved): only the proxy knows it.
FAR = "files.example"


class Origin(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/away":
            self.send_response(302)
            self.send_header("location", "http://elsewhere.example/x")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        body = f"origin {self.path}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class Proxy(BaseHTTPRequestHandler):
    """A forward proxy for plain http (absolute-form request lines) that knows
    FAR as the origin's address, and remembers every request it got."""

    origin: tuple[str, int]
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        url = urlsplit(self.path)
        host, port = (url.hostname or "", url.port or 80)
        if host == FAR:
            host, port = self.origin
        got = httpx.get(  # never itself through the environment's proxy
            f"http://{host}:{port}{url.path}", follow_redirects=False, timeout=5, trust_env=False
        )
        self.send_response(got.status_code)
        for name in ("location", "content-length"):
            if name in got.headers:
                self.send_header(name, got.headers[name])
        self.end_headers()
        self.wfile.write(got.content)

    def log_message(self, *args: object) -> None:
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # kept bound while used
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def sites() -> Iterator[tuple[str, list[str], int]]:
    """(the proxy's URL, the requests it saw, the origin's port)."""
    origin = serve(Origin)
    seen: list[str] = []
    handler = type("P", (Proxy,), {"origin": origin.server_address[:2], "seen": seen})
    proxy = serve(handler)
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}", seen, origin.server_address[1]
    finally:
        for server in (proxy, origin):
            server.shutdown()
            server.server_close()


@pytest.fixture(autouse=True)
def no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def test_a_fetch_goes_through_the_configured_proxy(sites: tuple[str, list[str], int]) -> None:
    proxy, seen, _ = sites
    policy = FetchPolicy(proxy=proxy)
    check_url(f"http://{FAR}/bundle.tar", policy)  # only the proxy resolves it: not refused
    with guarded_client(policy) as client:
        got = client.get(f"http://{FAR}/bundle.tar")
    assert got.status_code == 200 and got.text == "origin /bundle.tar"
    assert seen == [f"http://{FAR}/bundle.tar"]


def test_through_a_proxy_a_loopback_destination_is_refused_before_the_proxy_hears_of_it(
    sites: tuple[str, list[str], int],
) -> None:
    proxy, seen, origin_port = sites
    policy = FetchPolicy(proxy=proxy)
    for url in (f"http://127.0.0.1:{origin_port}/secret", f"http://localhost:{origin_port}/"):
        with pytest.raises(FetchRefused) as refused:
            check_url(url, policy)
        assert "loopback" in str(refused.value) and SETTING in str(refused.value)
        with guarded_client(policy) as client, pytest.raises(FetchRefused):
            client.get(url)
    assert seen == []  # nothing reached the proxy


def test_a_network_the_operator_allows_is_reached_through_the_proxy(
    sites: tuple[str, list[str], int],
) -> None:
    proxy, seen, origin_port = sites
    policy = FetchPolicy(allow_networks=(ipaddress.ip_network("127.0.0.0/8"),), proxy=proxy)
    with guarded_client(policy) as client:
        got = client.get(f"http://127.0.0.1:{origin_port}/lan")
    assert got.text == "origin /lan" and seen == [f"http://127.0.0.1:{origin_port}/lan"]


def test_a_redirect_to_another_host_is_not_followed_through_the_proxy(
    sites: tuple[str, list[str], int],
) -> None:
    proxy, seen, _ = sites
    client = guarded_client(FetchPolicy(proxy=proxy), follow_redirects=True)
    with client, pytest.raises(FetchRefused) as refused:
        client.get(f"http://{FAR}/away")
    assert "redirects are followed only within" in str(refused.value)
    assert seen == [f"http://{FAR}/away"]  # the hop to elsewhere.example was never sent


def test_the_environment_s_proxy_is_used_and_no_proxy_is_honoured(
    sites: tuple[str, list[str], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, seen, _ = sites
    monkeypatch.setenv("HTTP_PROXY", proxy)

    async def fetch() -> str:
        async with guarded_async_client(FetchPolicy()) as client:
            return (await client.get(f"http://{FAR}/hook")).text

    assert asyncio.run(fetch()) == "origin /hook"
    assert seen == [f"http://{FAR}/hook"]
    monkeypatch.setenv("NO_PROXY", FAR)  # direct, guarded: the name does not resolve here
    with guarded_client(FetchPolicy()) as client, pytest.raises(httpx.ConnectError):
        client.get(f"http://{FAR}/direct")
    assert len(seen) == 1


def test_a_proxy_setting_that_is_not_an_http_url_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[fetch]\nproxy = "socks5://proxy.lan:1080"\n')
    with pytest.raises(config.ConfigError) as refused:
        config.load(path)
    assert "proxy" in str(refused.value) and "http(s) proxy URL" in str(refused.value)
