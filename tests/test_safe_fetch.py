"""URLs an operator gives are fetched safely (letsinfer.fetch): http(s) only,
redirects only within the same host, and no non-global address (loopback,
private, link-local, the cloud metadata service, CGNAT, ...) unless
``[fetch] allow_networks`` lists its network, refused before any connection."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from letsinfer import config
from letsinfer.fetch import (
    FetchPolicy,
    FetchRefused,
    check_url,
    guarded_async_client,
    guarded_client,
)
from tests.nodes import free_port, letsinfer

SETTING = "[fetch] allow_networks"
BODY = b"the artifact's bytes\n"


def allowing(*networks: str, redirect_hosts: tuple[str, ...] = ()) -> FetchPolicy:
    return FetchPolicy(
        allow_networks=tuple(ipaddress.ip_network(n) for n in networks),
        allow_redirect_hosts=redirect_hosts,
    )


class Server(ThreadingHTTPServer):
    """A web server on 127.0.0.1 that counts the connections it accepts:
    ``/file`` is BODY, ``/to?URL`` redirects to URL, ``/here`` redirects to
    ``/file`` on the same host."""

    daemon_threads = True

    def __init__(self) -> None:
        self.connections = 0
        self.redirect_all: str | None = None  # every GET redirects there
        super().__init__(("127.0.0.1", free_port()), _Handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.connections += 1
        return True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        everywhere = self.server.redirect_all  # type: ignore[attr-defined]
        if path in ("/to", "/here") or everywhere:
            self.send_response(302)
            self.send_header("Location", everywhere or (query if path == "/to" else "/file"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    threading.Thread(target=running.serve_forever, daemon=True).start()
    try:
        yield running
    finally:
        running.shutdown()
        running.server_close()


# -- which addresses are refused -----------------------------------------------------


@pytest.mark.parametrize(
    ("host", "named"),
    [
        ("127.0.0.1", "127.0.0.1 is a loopback"),
        ("127.8.9.10", "127.8.9.10 is a loopback"),
        ("10.1.2.3", "10.1.2.3 is a private"),
        ("172.16.5.4", "172.16.5.4 is a private"),
        ("192.168.1.1", "192.168.1.1 is a private"),
        ("169.254.169.254", "169.254.169.254 is a link-local (cloud metadata)"),
        ("169.254.7.7", "169.254.7.7 is a link-local"),
        ("0.0.0.0", "0.0.0.0 is an unspecified"),
        ("224.0.0.251", "224.0.0.251 is a multicast"),
        ("240.1.2.3", "240.1.2.3 is a reserved"),
        ("100.64.0.1", "100.64.0.1 is a shared (carrier-grade NAT)"),
        ("192.0.2.1", "192.0.2.1 is a private"),  # documentation (TEST-NET-1)
        ("[::1]", "::1 is a loopback"),
        ("[::]", ":: is an unspecified"),
        ("[fe80::1]", "fe80::1 is a link-local"),
        ("[fd00::5]", "fd00::5 is a private"),
        ("[ff02::1]", "ff02::1 is a multicast"),
        ("[::ffff:127.0.0.1]", "::ffff:127.0.0.1 is a loopback"),
        ("[::ffff:169.254.169.254]", "::ffff:169.254.169.254 is a link-local (cloud metadata)"),
        ("[::ffff:10.0.0.1]", "::ffff:10.0.0.1 is a private"),
    ],
)
def test_a_non_global_address_is_refused_naming_it_and_the_setting(host: str, named: str) -> None:
    with pytest.raises(FetchRefused) as refusal:
        check_url(f"http://{host}:8080/latest/meta-data", FetchPolicy())
    message = str(refusal.value)
    assert named in message
    assert SETTING in message


@pytest.mark.parametrize("host", ["8.8.8.8", "1.1.1.1", "[2606:4700:4700::1111]"])
def test_a_global_address_is_fetched_without_any_setting(host: str) -> None:
    check_url(f"https://{host}/v1", FetchPolicy())


def test_listed_networks_are_allowed_and_only_those() -> None:
    policy = allowing("10.0.0.0/8", "fd00::/8")
    check_url("http://10.20.30.40/x", policy)
    check_url("http://[fd00::1]/x", policy)
    check_url("http://[::ffff:10.20.30.40]/x", policy)  # the IPv4 address it carries
    for refused in ("http://192.168.1.1/", "http://169.254.169.254/", "http://[::1]/"):
        with pytest.raises(FetchRefused, match=r"allow_networks"):
            check_url(refused, policy)


@pytest.mark.parametrize(
    "url",
    ["ftp://mirror.example/x", "file:///etc/passwd", "gopher://127.0.0.1/", "/etc/passwd"],
)
def test_only_http_and_https_urls_are_fetched(url: str) -> None:
    with pytest.raises(FetchRefused, match="only http and https URLs are fetched"):
        check_url(url, allowing("0.0.0.0/0", "::/0"))


def test_a_refusal_shows_no_credentials_or_query_of_the_url() -> None:
    for url in ("http://u:sk-one@169.254.169.254/x?token=sk-two#sk-3", "ftp://u:sk-one@h/?sk-two"):
        with pytest.raises(FetchRefused) as refusal:
            check_url(url, FetchPolicy())
        assert "sk-" not in str(refusal.value)


def test_the_policy_comes_from_the_fetch_section_of_the_nodes_settings(tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    file.write_text('[fetch]\nallow_networks = ["10.0.0.0/8", "127.0.0.1"]\n')
    policy = FetchPolicy.from_settings(config.load(file, environ={}))
    assert policy.allow_networks == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("127.0.0.1/32"),
    )
    env = {"LETSINFER_FETCH__ALLOW_NETWORKS": "192.168.0.0/16, fd00::/8"}
    assert len(FetchPolicy.from_settings(config.load(tmp_path / "none", env)).allow_networks) == 2
    file.write_text('[fetch]\nallow_networks = ["the lan"]\n')
    with pytest.raises(config.ConfigError, match="'the lan' is not a network"):
        config.load(file, environ={})


# -- the clients: every connection and every redirect checked ------------------------


def test_a_name_that_resolves_to_a_private_address_is_refused_before_any_connection(
    server: Server,
) -> None:
    port = server.server_address[1]
    url = f"http://localhost:{port}/file"
    with pytest.raises(FetchRefused, match=r"is a loopback address.*\[fetch\] allow_networks"):
        check_url(url, FetchPolicy())
    with guarded_client(FetchPolicy()) as client, pytest.raises(FetchRefused) as refusal:
        client.get(url)
    assert f"localhost:{port}" in str(refusal.value) and SETTING in str(refusal.value)

    async def fetch() -> None:
        async with guarded_async_client(FetchPolicy()) as client:
            await client.get(url)

    with pytest.raises(FetchRefused, match=r"is a loopback address"):
        asyncio.run(fetch())
    assert server.connections == 0  # the server never saw a connection


def test_an_allowed_network_is_fetched_and_a_redirect_within_the_host_followed(
    server: Server,
) -> None:
    policy = allowing("127.0.0.1/32", "::1/128")
    with guarded_client(policy, follow_redirects=True) as client:
        assert client.get(f"{server.url}/file").content == BODY
        followed = client.get(f"{server.url}/here")
        assert followed.content == BODY and followed.history[0].status_code == 302
        # Not asked to follow: the redirect itself is the answer.
        not_followed = client.get(f"{server.url}/to?http://127.0.0.2/x", follow_redirects=False)
        assert not_followed.status_code == 302

    async def fetch() -> bytes:
        async with guarded_async_client(policy, follow_redirects=True) as client:
            return (await client.get(f"{server.url}/here")).content

    assert asyncio.run(fetch()) == BODY


def test_a_redirect_to_another_host_is_refused_naming_its_target(server: Server) -> None:
    policy = allowing("127.0.0.0/8")
    target = f"http://127.0.0.2:{server.server_address[1]}/file"
    with (
        guarded_client(policy, follow_redirects=True) as client,
        pytest.raises(FetchRefused) as refusal,
    ):
        client.get(f"{server.url}/to?{target}")
    assert f"refused to follow the redirect from 127.0.0.1 to {target}" in str(refusal.value)
    assert server.connections == 1  # the redirect's target was never contacted


def test_a_redirect_to_an_allowed_host_on_a_loopback_address_not_allowed_is_refused(
    server: Server,
) -> None:
    # The server's own address is allowed, the redirect's host too, but not
    # the address that host has: each hop's address is checked.
    policy = allowing("127.0.0.1/32", redirect_hosts=("127.0.0.2",))
    port = server.server_address[1]
    with (
        guarded_client(policy, follow_redirects=True) as client,
        pytest.raises(FetchRefused) as refusal,
    ):
        client.get(f"{server.url}/to?http://127.0.0.2:{port}/file")
    assert "127.0.0.2 is a loopback address" in str(refusal.value)
    assert SETTING in str(refusal.value)
    assert server.connections == 1


def test_a_redirect_to_another_scheme_is_refused(server: Server) -> None:
    with (
        guarded_client(allowing("127.0.0.1/32"), follow_redirects=True) as client,
        pytest.raises(FetchRefused, match="only http and https URLs are fetched"),
    ):
        client.get(f"{server.url}/to?file:///etc/passwd")


# -- the commands: refused with a clear message, nothing recorded --------------------


def mirror_is_empty(home: Path) -> bool:
    listed = letsinfer(home, "mirror", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    blobs = home / "var" / "mirror" / "sha256"
    return json.loads(listed.stdout) == [] and not (blobs.exists() and any(blobs.iterdir()))


def test_mirror_add_of_the_metadata_service_is_refused_and_nothing_recorded(
    tmp_path: Path,
) -> None:
    home = tmp_path / "site"
    done = letsinfer(
        home, "mirror", "add", "http://169.254.169.254/latest/meta-data", "--sha256", "a" * 64
    )
    assert done.returncode == 1
    said = " ".join(done.stderr.split())
    assert "169.254.169.254 is a link-local (cloud metadata) address" in said
    assert SETTING in said and "nothing added" in said
    assert mirror_is_empty(home)

    refused = letsinfer(home, "mirror", "add", "file:///etc/passwd", "--sha256", "a" * 64)
    assert refused.returncode == 1 and "only http and https URLs" in refused.stderr
    assert mirror_is_empty(home)


def test_mirror_add_reaches_a_lan_server_only_once_its_network_is_listed(
    tmp_path: Path, server: Server
) -> None:
    import hashlib

    home, digest = tmp_path / "site", hashlib.sha256(BODY).hexdigest()
    refused = letsinfer(home, "mirror", "add", f"{server.url}/file", "--sha256", digest)
    assert refused.returncode == 1
    assert "127.0.0.1 is a loopback address" in refused.stderr and SETTING in refused.stderr
    assert server.connections == 0 and mirror_is_empty(home)

    lan = {"LETSINFER_FETCH__ALLOW_NETWORKS": "127.0.0.1/32"}
    elsewhere = f"http://127.0.0.2:{server.server_address[1]}/file"
    redirected = letsinfer(
        home, "mirror", "add", f"{server.url}/to?{elsewhere}", "--sha256", digest, env=lan
    )
    assert redirected.returncode == 1
    assert f"to {elsewhere}" in redirected.stderr and "nothing added" in redirected.stderr
    assert mirror_is_empty(home)

    added = letsinfer(home, "mirror", "add", f"{server.url}/here", "--sha256", digest, env=lan)
    assert added.returncode == 0, added.stderr
    assert not mirror_is_empty(home)


def test_a_hub_endpoint_on_a_network_not_listed_is_not_asked_anything() -> None:
    from letsinfer.hub.client import HubClient, HubUnreachable
    from tests.hubserver import FakeHub

    hub = FakeHub().start()
    try:
        hub.add_repo("org/model", {"model.gguf": BODY})
        with pytest.raises(HubUnreachable) as refusal:
            HubClient(hub.url, None, 5.0, FetchPolicy()).resolve("org/model", "main")
        assert "127.0.0.1 is a loopback address" in str(refusal.value)
        assert "[hub] endpoint" in str(refusal.value) and SETTING in str(refusal.value)
        assert hub.seen == []
        allowed = HubClient(hub.url, None, 5.0, allowing("127.0.0.1/32"))
        assert allowed.resolve("org/model", "main").commit == hub.repos["org/model"].commit
    finally:
        hub.stop()


def test_a_hub_that_redirects_its_api_to_another_host_is_refused(server: Server) -> None:
    from letsinfer.hub.client import HubClient, HubError, HubUnreachable

    target = f"http://127.0.0.2:{server.server_address[1]}/latest/meta-data"
    server.redirect_all = target
    hub = HubClient(server.url, None, 5.0, allowing("127.0.0.0/8"))
    with pytest.raises(HubError) as refusal:
        hub.resolve("org/model", "main")
    assert not isinstance(refusal.value, HubUnreachable)  # not a reason to use the mirror
    assert f"refused to follow the redirect from 127.0.0.1 to {target}" in str(refusal.value)
    assert server.connections == 1


def test_a_provider_the_site_no_longer_allows_is_not_served_after_a_restart(
    tmp_path: Path,
) -> None:
    import time

    import httpx

    from tests.nodes import start_node
    from tests.provider import Provider

    def ask(node: Any, key: str) -> httpx.Response:
        return httpx.post(
            node.url + "/v1/chat/completions",
            json={"model": "ext", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
        )

    home, key_file = tmp_path / "home", tmp_path / "provider.key"
    key_file.write_text("sk-provider\n")
    key_file.chmod(0o600)
    with Provider(key="sk-provider", model="prov-m") as provider:
        node = start_node(home, env={"LETSINFER_FETCH__ALLOW_NETWORKS": "127.0.0.0/8"})
        try:
            assert node.key is not None
            key = node.key
            added = node.cli(
                "model", "add", "ext", "--external", provider.url,
                "--provider-model", "prov-m", "--key-file", str(key_file),
            )  # fmt: skip
            assert added.returncode == 0, added.stderr
            deadline = time.monotonic() + 60
            while ask(node, key).status_code != 200:
                assert time.monotonic() < deadline, "the provider never answered"
                time.sleep(0.2)
        finally:
            node.stop()
        seen = len(provider.seen)

        # The site's [fetch] no longer lists loopback: the main starts without it.
        node = start_node(home, env={"LETSINFER_FETCH__ALLOW_NETWORKS": ""}, degraded=True)
        try:
            assert ask(node, key).status_code == 503
            assert len(provider.seen) == seen  # nothing reached the provider
            said = " ".join(node.log().split())
            assert "model ext is not served" in said and "127.0.0.1 is a loopback address" in said
            assert SETTING in said
        finally:
            node.stop()
