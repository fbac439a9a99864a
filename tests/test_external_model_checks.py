"""`model add --external`, `--alias`, `--fallback` and `model fallback`: what
they refuse (with a precise message, an audit record and nothing else changed)
and what they accept with a note."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import stat
from collections.abc import Iterator
from pathlib import Path

import certifi
import httpx
import pytest
from starlette.types import Receive, Scope, Send

from letsinfer.authority.external import add_external_model, check_url, set_fallback
from letsinfer.control.ops import ops_router
from letsinfer.control.typed_app import typed_app
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity
from letsinfer.store import AuthorityStore, StoreError
from letsinfer.trust.peer import Peer
from letsinfer.trust.pki import CertIdentity
from tests.nodes import letsinfer

URL = "http://127.0.0.1:9/v1"  # a closed port: nothing here sends a request


def private_key(directory: Path, mode: int = 0o600, name: str = "provider.key") -> Path:
    path = directory / name
    path.write_text("sk-provider-secret\n")
    path.chmod(mode)
    return path


@pytest.fixture
def store(tmp_path: Path) -> Iterator[AuthorityStore]:
    opened = AuthorityStore(tmp_path / "authority.db")
    try:
        opened.add_service("local", "0" * 64, 0, "gguf", None)
        yield opened
    finally:
        opened.close()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A main's home (its tiny model included) with no node running: the CLI
    writes the authority itself."""
    home = tmp_path_factory.mktemp("main") / "home"
    # Its providers are on loopback: a site lists the networks they are on.
    (home / "etc").mkdir(parents=True)
    (home / "etc" / "config.toml").write_text('[fetch]\nallow_networks = ["127.0.0.0/8"]\n')
    done = letsinfer(home, "node", "init", "--main", timeout=120)
    assert done.returncode == 0, done.stderr
    return home


def cli(home: Path, *args: str) -> tuple[int, str, str]:
    done = letsinfer(home, *args, timeout=120)
    return done.returncode, done.stdout, done.stderr


def models(home: Path) -> list[dict[str, object]]:
    code, out, err = cli(home, "model", "list", "--json")
    assert code == 0, err
    return json.loads(out)


def audit(home: Path) -> list[dict[str, object]]:
    code, out, err = cli(home, "audit", "list", "--json")
    assert code == 0, err
    return json.loads(out)


def refused(home: Path, *args: str) -> tuple[str, list[dict[str, object]]]:
    """Run a command that must be refused: its message, and the audit records
    it added. The models are as they were."""
    before_models, before_audit = models(home), audit(home)
    code, out, err = cli(home, *args)
    assert code == 1, (args, out, err)
    assert models(home) == before_models, args
    return " ".join(err.split()), audit(home)[len(before_audit) :]


# -- 1. the URL's scheme and host in lower case -----------------------------------


def test_a_urls_scheme_and_host_are_kept_in_lower_case(
    store: AuthorityStore, tmp_path: Path
) -> None:
    assert check_url("HTTP://Api.Example.COM:8080/V1/") == "http://api.example.com:8080/V1"
    assert check_url("HTTPS://[::1]:8443/v1") == "https://[::1]:8443/v1"
    key, ca = private_key(tmp_path), Path(certifi.where())
    svc = add_external_model(store, "e", "HTTPS://API.example.com/v1", "m", key, ca_file=ca)
    assert svc.external is not None and svc.external["url"] == "https://api.example.com/v1"
    with pytest.raises(StoreError, match="--ca-file is for an https URL"):
        add_external_model(store, "f", "HTTP://api.example.com/v1", "m", key, ca_file=ca)


def test_a_refused_url_is_shown_without_what_may_be_a_secret(store: AuthorityStore) -> None:
    for url in ("https://user:sk-pw@api.example.com/v1", "https://h/v1?api-key=sk-pw"):
        with pytest.raises(StoreError, match="no user, query or fragment") as refusal:
            check_url(url)
        assert "sk-pw" not in str(refusal.value)
    with pytest.raises(StoreError, match="Invalid IPv6 URL"):
        check_url("http://[::1/v1")


def test_a_url_no_request_line_can_carry_is_refused(store: AuthorityStore) -> None:
    for url in ("http://127.0.0.1:9/v1/модель", "http://пример.localhost/v1", "http://h/v 1"):
        with pytest.raises(StoreError, match="characters a request line cannot carry"):
            check_url(url)
    assert check_url("http://xn--e1afmkfd.localhost/v1/%D0%BC") == (
        "http://xn--e1afmkfd.localhost/v1/%D0%BC"
    )


def test_an_uppercase_http_url_still_warns_that_the_key_travels_unencrypted(
    home: Path, tmp_path: Path
) -> None:
    key = private_key(tmp_path)
    code, out, err = cli(
        home, "model", "add", "upper", "--external", "HTTP://127.0.0.1:9/v1", "--key-file", str(key)
    )
    assert code == 0, err
    assert "key travels unencrypted over http://" in out
    [upper] = [m for m in models(home) if m["name"] == "upper"]
    assert upper["external"]["url"] == "http://127.0.0.1:9/v1"  # type: ignore[index]
    code, shown, err = cli(home, "model", "show", "upper")
    assert code == 0 and "at most  64 requests at once" in shown, err  # its --concurrency


# -- 2. a key file others can write -------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "who"),
    [(0o602, "every user of this machine"), (0o620, "its group"), (0o660, "its group")],
    ids=["602", "620", "660"],
)
def test_a_key_file_others_can_write_is_refused(
    store: AuthorityStore, tmp_path: Path, mode: int, who: str
) -> None:
    key = private_key(tmp_path, mode)
    assert stat.S_IMODE(key.stat().st_mode) == mode
    with pytest.raises(StoreError) as refusal:
        add_external_model(store, "e", URL, "m", key)
    assert str(refusal.value) == (
        f"key file {key} can be written by {who}, who could swap in their own key; "
        f"make it private first (chmod 600 {key}, or 640 with the letsinfer group)"
    )
    assert [s.name for s in store.list_services()] == ["local"]
    key.chmod(0o640)  # readable by the letsinfer group: as the docs say
    assert add_external_model(store, "e", URL, "m", key).name == "e"


def test_a_world_writable_key_file_is_refused_by_the_cli(home: Path, tmp_path: Path) -> None:
    key = private_key(tmp_path, 0o602, "ww.key")
    message, records = refused(
        home, "model", "add", "ww", "--external", URL, "--key-file", str(key)
    )
    assert f"key file {key} can be written by every user of this machine" in message
    assert [(r["action"], r["outcome"], r["target"]) for r in records] == [
        ("model.add", "denied", "ww")
    ]


# -- 3. aliases given twice, or the model's own name --------------------------------


def test_an_alias_given_twice_or_the_models_own_name_is_refused(
    store: AuthorityStore, tmp_path: Path
) -> None:
    key = private_key(tmp_path)
    for aliases, words in (
        (("y", "y"), "alias 'y' is given twice"),
        (("z", "x"), "alias 'x' is the model's own name"),
    ):
        with pytest.raises(StoreError, match=words):
            add_external_model(store, "x", URL, "m", key, aliases=aliases)
        with pytest.raises(StoreError, match=words):
            store.add_service("x", "1" * 64, 0, "gguf", None, aliases)
    assert [s.name for s in store.list_services()] == ["local"]
    assert add_external_model(store, "x", URL, "m", key, aliases=("y", "z")).aliases == ("y", "z")


def test_the_cli_refuses_repeated_or_own_aliases_for_both_kinds_of_model(
    home: Path, tmp_path: Path, tiny_gguf: Path
) -> None:
    key = private_key(tmp_path)
    external = ("--external", URL, "--key-file", str(key))
    for kind in (external, ("--gguf", str(tiny_gguf))):
        message, records = refused(home, "model", "add", "x", *kind, "--alias", "y", "--alias", "y")
        assert "alias 'y' is given twice" in message
        assert [(r["action"], r["outcome"]) for r in records] == [("model.add", "denied")]
        message, _ = refused(home, "model", "add", "x", *kind, "--alias", "x")
        assert "alias 'x' is the model's own name" in message


# -- 4. refusals reach the audit chain ------------------------------------------------


def test_refused_model_changes_are_audited_and_change_nothing_else(
    home: Path, tmp_path: Path
) -> None:
    readable = private_key(tmp_path, 0o644, "readable.key")
    message, records = refused(
        home, "model", "add", "open", "--external", URL, "--key-file", str(readable)
    )
    assert "can be read by every user of this machine" in message
    assert [(r["action"], r["outcome"], r["target"]) for r in records] == [
        ("model.add", "denied", "open")
    ]
    assert "can be read by every user" in str(records[0]["detail"])

    key = private_key(tmp_path)
    message, records = refused(
        home,
        "model",
        "add",
        "lost",
        "--external",
        URL,
        "--key-file",
        str(key),
        "--fallback",
        "nosuch",
    )
    assert "fallback 'nosuch': no such model" in message
    assert [(r["action"], r["outcome"], r["target"]) for r in records] == [
        ("model.add", "denied", "lost")
    ]

    message, records = refused(home, "model", "fallback", "tiny", "tiny")
    assert "model tiny cannot be its own fallback" in message
    assert [(r["action"], r["outcome"], r["target"]) for r in records] == [
        ("model.fallback", "denied", "tiny")
    ]

    # A secret in a refused URL stays out of the audit chain too.
    message, records = refused(home, "model", "add", "e", "--external", "https://u:sk-pw@h/v1")
    assert "sk-pw" not in message and "sk-pw" not in json.dumps(records)
    assert [(r["action"], r["outcome"]) for r in records] == [("model.add", "denied")]
    assert cli(home, "audit", "verify")[0] == 0


def test_a_refused_fallback_change_is_audited(store: AuthorityStore) -> None:
    with pytest.raises(StoreError, match="no model 'nothing'"):
        set_fallback(store, "nothing", "local", role="main")
    with pytest.raises(StoreError, match="cannot be its own fallback"):
        set_fallback(store, "local", "local")
    assert [(r.action, r.outcome, r.target, r.role) for r in store.list_audit()] == [
        ("model.fallback", "denied", "nothing", "main"),
        ("model.fallback", "denied", "local", None),
    ]
    assert store.get_service("local").fallback is None  # type: ignore[union-attr]


def test_refused_adapter_changes_are_audited_and_change_nothing(
    store: AuthorityStore, tmp_path: Path
) -> None:
    from letsinfer.authority.adapters import add_adapter, remove_adapter

    add_external_model(store, "ext", URL, "their-model", private_key(tmp_path))
    store.add_service("other", "1" * 64, 0, "gguf", None, aliases=("alias",))
    models = tmp_path / "models"
    not_a_lora = tmp_path / "x.gguf"
    not_a_lora.write_bytes(b"GGUF")
    before = len(store.list_audit())
    for base, name, why in (
        ("ext", "tuned", "model ext is external"),
        ("nothing", "tuned", "no model 'nothing'"),
        ("local", "alias", "already"),
        ("local", "bad name!", "invalid model name"),
        ("local", "tuned", "adapter 'tuned' refused"),  # the file is no adapter
    ):
        with pytest.raises(StoreError, match=why):
            add_adapter(store, models, base, name, not_a_lora, actor="cli", role="main")
    for name, why in (("local", "is a model, not a LoRA adapter"), ("gone", "no LoRA adapter")):
        with pytest.raises(StoreError, match=why):
            remove_adapter(store, models, name)
    records = store.list_audit()[before:]
    assert [(r.action, r.outcome, r.target) for r in records] == [
        ("model.adapter.add", "denied", "tuned"),
        ("model.adapter.add", "denied", "tuned"),
        ("model.adapter.add", "denied", "alias"),
        ("model.adapter.add", "denied", None),  # an invalid name is only in the detail
        ("model.adapter.add", "denied", "tuned"),
        ("model.adapter.remove", "denied", "local"),
        ("model.adapter.remove", "denied", "gone"),
    ]
    assert "bad name!" in records[3].detail and records[0].role == "main"
    assert store.list_adapters() == []
    assert not [p for p in models.rglob("*") if p.is_file()]


# -- 5. fallbacks: one's own, loops, an adapter's base --------------------------------


def test_a_model_being_added_cannot_be_its_own_fallback(
    store: AuthorityStore, tmp_path: Path, home: Path, tiny_gguf: Path
) -> None:
    key = private_key(tmp_path)
    for aliases, fallback in (((), "e"), (("e2",), "e2")):
        with pytest.raises(StoreError, match="model e cannot be its own fallback"):
            add_external_model(store, "e", URL, "m", key, aliases=aliases, fallback=fallback)
    assert [s.name for s in store.list_services()] == ["local"]

    message, records = refused(
        home, "model", "add", "t2", "--gguf", str(tiny_gguf), "--fallback", "t2"
    )
    assert "model t2 cannot be its own fallback" in message and "no such model" not in message
    assert [(r["action"], r["outcome"]) for r in records] == [("model.add", "denied")]
    message, _ = refused(
        home, "model", "add", "t2", "--gguf", str(tiny_gguf), "--alias", "t3", "--fallback", "t3"
    )
    assert "model t2 cannot be its own fallback" in message


def test_a_fallback_loop_and_an_adapters_own_base_are_accepted_with_a_note(
    home: Path, tmp_path: Path
) -> None:
    key = private_key(tmp_path)
    code, out, err = cli(
        home, "model", "add", "ext", "--external", URL, "--key-file", str(key), "--fallback", "tiny"
    )
    assert code == 0, err
    assert "note" not in out
    code, out, err = cli(home, "model", "fallback", "tiny", "ext")
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("note")]
    assert notes == [
        "note: ext falls back to tiny in turn: a request goes at most one hop, so it never loops"
    ]

    authority = AuthorityStore(Home.under(home).database)
    try:
        authority.add_adapter("tuned", "tiny", "1" * 64, 1, None)  # (its file: not needed here)
    finally:
        authority.close()
    code, out, err = cli(home, "model", "fallback", "tuned", "tiny")
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("note")]
    assert notes == [
        "note: tiny is the base model of adapter tuned: its fallback answers without the adapter"
    ]
    code, out, err = cli(home, "model", "fallback", "tuned", "ext")
    assert code == 0 and "note" not in out, (out, err)
    for name in ("tiny", "tuned"):
        assert cli(home, "model", "fallback", name, "--clear")[0] == 0


def test_an_external_model_has_no_release_to_roll_back_and_a_model_is_no_adapter(
    store: AuthorityStore, tmp_path: Path
) -> None:
    from types import SimpleNamespace

    from letsinfer.authority.adapters import remove_adapter
    from letsinfer.lifecycle.rollout import RolloutRefused, rollback_changes, upgrade_changes

    add_external_model(store, "ext", URL, "m", private_key(tmp_path))
    serving = SimpleNamespace(store=store)  # (refused before anything else is read)
    with pytest.raises(RolloutRefused, match=r"ext is external .* no engine release"):
        rollback_changes(serving, "ext", None, [])  # type: ignore[arg-type]
    with pytest.raises(RolloutRefused, match="ext is external"):
        upgrade_changes(serving, "ext", "any-release", [])  # type: ignore[arg-type]
    with pytest.raises(StoreError, match=r"'local' is a model, not a LoRA adapter .*model remove"):
        remove_adapter(store, tmp_path / "models", "local")
    assert [s.name for s in store.list_services()] == ["ext", "local"]


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_only_an_administrator_may_change_a_fallback_over_the_node(
    store: AuthorityStore, tmp_path: Path, role: str
) -> None:
    # A fallback may send requests to a provider outside: a paired controller
    # of a lesser role is refused, audited, and changes nothing.
    add_external_model(store, "ext", URL, "m", private_key(tmp_path))
    app = typed_app("test ops")
    app.include_router(ops_router(store, NodeIdentity(node_id="n-main", name="main", role="main")))

    def change(who: str) -> httpx.Response:
        identity = CertIdentity("controller", "c-1", who, "0" * 64, 1, dt.datetime.now(dt.UTC))

        async def gate(scope: Scope, receive: Receive, send: Send) -> None:
            # (What the control plane's mutual-TLS gate puts there from the certificate.)
            scope.setdefault("state", {})["peer"] = Peer(identity, "10.0.0.9")
            await app(scope, receive, send)

        async def post() -> httpx.Response:
            transport = httpx.ASGITransport(app=gate)
            async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
                return await client.post("/v1/ops/models/local/fallback", json={"fallback": "ext"})

        return asyncio.run(post())

    refused = change(role)
    assert refused.status_code == 403 and "needs the administrator role" in refused.text
    assert store.get_service("local").fallback is None  # type: ignore[union-attr]
    denied = [(r.action, r.role) for r in store.list_audit() if r.outcome == "denied"]
    assert denied == [("/v1/ops/models/local/fallback", role)]
    done = change("administrator")
    assert done.status_code == 200 and done.json()["fallback"] == "ext"
    assert store.get_service("local").fallback == "ext"  # type: ignore[union-attr]


def test_removing_a_model_says_whose_fallback_it_was(home: Path, tmp_path: Path) -> None:
    key = private_key(tmp_path)
    code, _, err = cli(home, "model", "add", "gone", "--external", URL, "--key-file", str(key))
    assert code == 0, err
    assert cli(home, "model", "fallback", "tiny", "gone")[0] == 0
    code, out, err = cli(home, "model", "remove", "gone")
    assert code == 0, err
    assert "no longer falling back to it: tiny" in out
    [tiny] = [m for m in models(home) if m["name"] == "tiny"]
    assert tiny["fallback"] is None
    code, out, _ = cli(home, "audit", "list", "--json")
    [record] = [r for r in json.loads(out) if r["action"] == "model.remove"]
    assert "fallback of tiny cleared" in record["detail"]


def test_a_provider_on_a_network_the_site_does_not_list_is_refused_and_audited(
    home: Path, tmp_path: Path
) -> None:
    # The site lists 127.0.0.0/8 only: the metadata service and another LAN are out.
    key = private_key(tmp_path)
    for url, named in (
        ("http://169.254.169.254/latest", "169.254.169.254 is a link-local (cloud metadata)"),
        ("https://192.168.7.7/v1", "192.168.7.7 is a private"),
    ):
        message, records = refused(
            home, "model", "add", "inside", "--external", url, "--key-file", str(key)
        )
        assert named in message and "[fetch] allow_networks" in message
        assert [(r["action"], r["outcome"], r["target"]) for r in records] == [
            ("model.add", "denied", "inside")
        ]
        assert named in str(records[0]["detail"])
    code, _, err = cli(home, "model", "add", "inside", "--external", URL, "--key-file", str(key))
    assert code == 0, err
