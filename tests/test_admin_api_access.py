"""Who may act on the main, from a paired workstation: `auth controller add`
and `revoke`, `exposure enable` and `disable`, and `node add --code` typed at
the main and at a workstation (tests/admin_desk.py: in-process, through the
real control app with each controller's real certificate). The same output
and exit code in both places, an administrator's only (anyone less is
refused before anything but the notice is sent), bad input refused with
nothing changed, every change audited under the controller."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

import pytest

from letsinfer.authority import controllers, joining
from letsinfer.doctor.exposure import exposure_certificate
from letsinfer.exposure import settings as exposure_settings
from letsinfer.exposure.certificate import MAX_PEM, cluster_files
from letsinfer.identity import load_identity, new_node_id
from letsinfer.trust import pki
from letsinfer.trust.join_code import JoinCode
from letsinfer.trust.material import ClusterCA
from tests.admin_desk import Desk, Typed, audited, store_state
from tests.test_exposure import _self_signed

NOTICE = ("POST", "/v1/ops/denied")


def same(remote: Typed, local: Typed) -> None:
    assert (remote.code, remote.out, remote.err) == (local.code, local.out, local.err)


def ca_of(desk: Desk) -> ClusterCA:
    identity = load_identity(desk.main.home.identity_file)
    assert identity is not None
    return ClusterCA(desk.main.home, identity)


# -- auth controller add / revoke ---------------------------------------------------


def test_auth_controller_add_from_a_workstation_prints_a_code_that_pairs(desk: Desk) -> None:
    store = desk.main.store
    since = len(store.list_audit())
    remote = desk.at_ws("fuzz", "auth", "controller", "add", "--role", "operator", "--name", "ws")
    local = desk.at_main("auth", "controller", "add", "--role", "operator", "--name", "here")
    assert remote.code == local.code == 0, remote.err
    code = re.search(r"^code: (\S+)$", remote.out, re.M)
    comparison = re.search(r"^comparison: (\S+)$", remote.out, re.M)
    assert code and comparison

    def plain(out: str) -> str:  # the code and its comparison string are new each time
        out = re.sub(r"^(code|comparison): \S+$", r"\1: X", out, flags=re.M)
        return out.replace("controller ws ", "controller NAME ").replace(
            "controller here ", "controller NAME "
        )

    assert plain(remote.out) == plain(local.out) and remote.err == local.err == ""
    assert "pairing code for controller ws (operator), valid 10 min:" in remote.out
    assert ("controller:fuzz", "auth.controller.add", "ok") in audited(store, since)

    ca = ca_of(desk)
    assert comparison.group(1) == controllers.comparison_string(ca.fingerprint, code.group(1))
    csr = pki.make_csr(pki.new_key(), "controller").decode()
    paired, cert = controllers.pair(store, ca, code.group(1), csr, lambda why: None)
    assert (paired.name, paired.role, paired.state) == ("ws", "operator", "paired")
    assert pki.identity_of(pki.load_cert(cert)).role == "operator"


def test_auth_controller_add_of_a_taken_name_or_bad_role_is_refused_alike(desk: Desk) -> None:
    store = desk.main.store
    before = store_state(store)
    for argv in (["--role", "viewer", "--name", "op"], ["--role", "viewer", "--name", "x" * 65]):
        remote = desk.at_ws("fuzz", "auth", "controller", "add", *argv)
        local = desk.at_main("auth", "controller", "add", *argv)
        same(remote, local)
        assert remote.code == 1, argv
    taken = desk.at_ws("fuzz", "auth", "controller", "add", "--role", "viewer", "--name", "op")
    assert "a controller named 'op' exists already" in taken.err
    assert "Nothing changed." in taken.err
    sent = len(desk.sent)
    remote = desk.at_ws("fuzz", "auth", "controller", "add", "--role", "root")
    same(remote, desk.at_main("auth", "controller", "add", "--role", "root"))
    assert remote.code == 2 and len(desk.sent) == sent  # refused here: nothing sent
    assert store_state(store) == before
    with desk.main.client("fuzz") as admin:
        assert admin.post("/v1/ops/controllers", json={"role": "root"}).status_code == 422
        assert (
            admin.post("/v1/ops/controllers", json={"role": "viewer", "name": "op"}).status_code
            == 409
        )
    assert store_state(store) == before


def test_auth_controller_revoke_from_a_workstation_says_what_the_main_says(desk: Desk) -> None:
    store = desk.main.store
    ca = ca_of(desk)
    for name in ("gone-a", "gone-b"):
        controllers.new_pairing(store, ca.fingerprint, "viewer", name, 600)
    since = len(store.list_audit())
    remote = desk.at_ws("fuzz", "auth", "controller", "revoke", "gone-a")
    local = desk.at_main("auth", "controller", "revoke", "gone-b")
    assert remote.code == local.code == 0, remote.err
    assert remote.out == "controller gone-a revoked\n"
    assert remote.out.replace("gone-a", "gone-b") == local.out and remote.err == local.err
    assert ("controller:fuzz", "auth.controller.revoke", "ok") in audited(store, since)
    states = {c.name: c.state for c in store.list_controllers()}
    assert states["gone-a"] == states["gone-b"] == "revoked"

    before = store_state(store)
    for name in ("gone-a", "nobody"):
        remote = desk.at_ws("fuzz", "auth", "controller", "revoke", name)
        same(remote, desk.at_main("auth", "controller", "revoke", name))
        assert remote.code == 1 and f"no active controller {name!r}" in remote.err
    assert store_state(store) == before
    with desk.main.client("fuzz") as admin:
        raw = admin.post("/v1/ops/controllers/revoke", json={"name": "nobody"})
    assert raw.status_code == 404 and store_state(store) == before


def test_a_controller_does_not_revoke_itself(desk: Desk) -> None:
    """The only administrator's controller revoking itself (a typo would
    leave no workstation able to administer the main) is refused, by name
    or by id, audited, and nothing changes; a shell on the main still can."""
    store = desk.main.store
    before, since = store_state(store), len(store.list_audit())
    refused = desk.at_ws("fuzz", "auth", "controller", "revoke", "fuzz")
    assert refused.code == 1
    assert "controller fuzz is the one asking: a controller does not revoke itself" in " ".join(
        refused.err.split()
    )
    assert "Nothing changed." in refused.err
    assert store_state(store) == before
    assert audited(store, since) == [("controller:fuzz", "auth.controller.revoke", "denied")]
    [fuzz] = [c for c in store.list_controllers() if c.name == "fuzz"]
    with desk.main.client("fuzz") as admin:
        assert admin.post("/v1/ops/controllers/revoke", json={"name": fuzz.id}).status_code == 409
    assert store_state(store) == before
    assert desk.at_main("auth", "controller", "revoke", "fuzz").code == 0
    with desk.main.client("fuzz") as gone:  # revoked: its certificate is refused now
        assert gone.get("/v1/ops/controllers").status_code == 403


@pytest.mark.parametrize("who", ["op", "watcher"])
def test_less_than_an_administrator_may_not_add_or_revoke_controllers(desk: Desk, who: str) -> None:
    store = desk.main.store
    before, since = store_state(store), len(store.list_audit())
    for argv in (["add", "--role", "administrator", "--name", "mine"], ["revoke", "fuzz"]):
        refused = desk.at_ws(who, "auth", "controller", *argv)
        assert refused.code == 1, refused.err
        assert "needs the administrator role" in refused.err and "was not sent" in refused.err
    assert desk.sent == [(who, *NOTICE)] * 2  # the notices alone
    assert audited(store, since) == [
        (f"controller:{who}", f"cli:auth controller {verb}", "denied") for verb in ("add", "revoke")
    ]
    with desk.main.client(who) as client:
        assert client.post("/v1/ops/controllers", json={"role": "administrator"}).status_code == 403
        assert client.post("/v1/ops/controllers/revoke", json={"name": "fuzz"}).status_code == 403
    assert store_state(store) == before


# -- exposure enable / disable -------------------------------------------------------


def no_expiry(out: str) -> str:
    """Two certificates the cluster CA issued a moment apart may expire a minute apart."""
    return re.sub(r"^  expires   .*$", "  expires   X", out, flags=re.M)


def published(desk: Desk) -> str | None:
    path = exposure_settings.exposure_file(desk.main.home)
    return path.read_text() if path.exists() else None


def test_exposure_by_the_cluster_ca_enabled_and_disabled_from_a_workstation(desk: Desk) -> None:
    store = desk.main.store
    since = len(store.list_audit())
    enable = ("exposure", "enable", "--cluster-ca", "--san", "gw.example", "--port", "9443")
    enable += ("--from", "10.0.0.0/8", "--plain", "off")
    typed = {}
    for where in ("ws", "main"):
        for verb in (enable, ("exposure", "disable"), ("exposure", "disable")):
            done = desk.at_ws("fuzz", *verb) if where == "ws" else desk.at_main(*verb)
            assert done.code == 0, (where, verb, done.err)
            typed.setdefault(where, []).append(done)
            if verb == enable:
                shown = json.loads(desk.at_main("exposure", "status", "--json").out)
                assert shown["certificate"]["sans"] == ["DNS:gw.example"]
                assert shown["port"] == 9443 and shown["sources"] == ["10.0.0.0/8"]
    for remote, local in zip(typed["ws"], typed["main"], strict=True):
        assert (no_expiry(remote.out), remote.err) == (no_expiry(local.out), local.err)
    said = typed["ws"][0].out
    assert said.startswith("published: https://0.0.0.0:9443/v1 (and /health) to 10.0.0.0/8\n")
    assert (
        "  names     DNS:gw.example\n" in said and "trust     clients trust the cluster CA" in said
    )
    assert "  plain     off: takes effect at the next start" in said
    assert typed["ws"][1].out.startswith("closed: the inference plane serves the LAN only")
    assert "the LAN listener returns at the next start" in typed["ws"][1].out
    assert typed["ws"][2].out == "not published: nothing to close\n"
    assert published(desk) is None
    mine = [a for a in audited(store, since) if a[0] == "controller:fuzz"]
    assert mine == [
        ("controller:fuzz", "exposure.enable", "ok"),
        ("controller:fuzz", "exposure.disable", "ok"),
        ("controller:fuzz", "exposure.disable", "ok"),
    ]


def test_a_workstation_s_own_certificate_is_sent_checked_and_stored_on_the_main(
    desk: Desk, tmp_path: Path
) -> None:
    """--cert and --key name the workstation's files: their text goes to the
    main, which stores its copy with the exposure's; on the main itself the
    same options serve the operator's files in place. The same words both."""
    cert, key = _self_signed(tmp_path / "ws-pair")
    argv = ("exposure", "enable", "--cert", str(cert), "--key", str(key), "--port", "9443")
    remote = desk.at_ws("fuzz", *argv)
    assert remote.code == 0, remote.err
    stored_cert, stored_key = cluster_files(desk.main.home)
    saved = json.loads(published(desk) or "{}")
    assert (saved["cert"], saved["key"]) == (str(stored_cert), str(stored_key))
    assert stored_cert.read_bytes() == cert.read_bytes()
    assert stored_key.read_bytes() == key.read_bytes() and stored_key.stat().st_mode & 0o077 == 0
    assert not saved["cluster_ca"]
    assert "  subject   CN=exposed.example\n" in remote.out
    # Renewing is sending the renewed files again: doctor says so near expiry.
    identity = load_identity(desk.main.home.identity_file)
    near = pki.load_cert(cert.read_bytes()).not_valid_after_utc - dt.timedelta(days=1)
    [finding] = exposure_certificate(desk.main.home, identity, now=near)
    assert finding.level == "warn"
    assert finding.fix.startswith("letsinfer exposure enable --cert RENEWED_CERT --key ITS_KEY")
    local = desk.at_main(*argv)
    same(remote, local)
    saved = json.loads(published(desk) or "{}")
    assert (saved["cert"], saved["key"]) == (str(cert), str(key))  # in place, on the main
    status = json.loads(desk.at_ws("watcher", "exposure", "status", "--json").out)
    assert status["certificate"]["subject"] == "CN=exposed.example"

    # A controller with its own HTTP client: an oversized, mismatched or
    # option-less body is refused and nothing changes.
    _, other = _self_signed(tmp_path / "other")
    good = {"cert_pem": cert.read_text(), "key_pem": key.read_text(), "port": 9443}
    kept, kept_cert = published(desk), stored_cert.read_bytes()
    before = store_state(desk.main.store)
    with desk.main.client("fuzz") as admin:
        answers = [
            admin.post("/v1/ops/exposure/enable", json={**good, "cert_pem": "x" * (MAX_PEM + 1)}),
            admin.post("/v1/ops/exposure/enable", json={**good, "key_pem": other.read_text()}),
            admin.post("/v1/ops/exposure/enable", json={"port": 9443}),
            admin.post("/v1/ops/exposure/enable", json={**good, "cluster_ca": True}),
            admin.post("/v1/ops/exposure/enable", json={**good, "port": 8000}),
            admin.post("/v1/ops/exposure/enable", json={**good, "sources": ["nowhere"]}),
        ]
    assert [a.status_code for a in answers] == [422, 400, 400, 400, 409, 400]
    assert "the key (sent) does not match the certificate (sent)" in answers[1].text
    assert "the plain gateway's port" in answers[4].text
    assert published(desk) == kept and stored_cert.read_bytes() == kept_cert
    assert store_state(desk.main.store) == before


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("expired", "expired on"),
        ("mismatch", "does not match the certificate"),
        ("garbage", "holds no PEM certificate"),
        ("ca", "is a CA certificate"),
        ("missing", "cannot read the certificate"),
        ("huge", "is larger than 64 KiB"),
    ],
)
def test_a_bad_certificate_from_a_workstation_is_refused_as_on_the_main(
    desk: Desk, tmp_path: Path, kind: str, says: str
) -> None:
    first = desk.at_main("exposure", "enable", "--cluster-ca", "--san", "gw.example")
    assert first.code == 0, first.err
    kept, kept_cert = published(desk), cluster_files(desk.main.home)[0].read_bytes()
    cert, key = _self_signed(
        tmp_path / "pair", days=-1 if kind == "expired" else 30, ca=kind == "ca"
    )
    if kind == "mismatch":
        _, key = _self_signed(tmp_path / "other")
    elif kind == "garbage":
        cert.write_text("not a certificate\n")
    elif kind == "missing":
        cert = tmp_path / "nowhere.pem"
    elif kind == "huge":
        cert.write_text(cert.read_text() + "#" * MAX_PEM)
    argv = ("exposure", "enable", "--cert", str(cert), "--key", str(key), "--port", "9443")
    before, since = store_state(desk.main.store), len(desk.main.store.list_audit())
    remote = desk.at_ws("fuzz", *argv)
    same(remote, desk.at_main(*argv))
    assert remote.code == 1 and says in remote.err and "Nothing changed." in remote.err
    assert str(key if kind == "mismatch" else cert) in remote.err  # the workstation's file
    assert published(desk) == kept and cluster_files(desk.main.home)[0].read_bytes() == kept_cert
    assert store_state(desk.main.store) == before
    assert audited(desk.main.store, since) == []
    if kind in ("missing", "huge"):  # refused on the workstation: nothing sent
        assert desk.sent == []


@pytest.mark.parametrize("who", ["op", "watcher"])
def test_less_than_an_administrator_may_not_publish_or_close(
    desk: Desk, tmp_path: Path, who: str
) -> None:
    cert, key = _self_signed(tmp_path / "pair")
    assert desk.at_main("exposure", "enable", "--cluster-ca", "--san", "gw.example").code == 0
    kept, since = published(desk), len(desk.main.store.list_audit())
    for argv in (
        ["enable", "--cert", str(cert), "--key", str(key)],
        ["enable", "--cluster-ca", "--san", "other.example"],
        ["disable"],
    ):
        refused = desk.at_ws(who, "exposure", *argv)
        assert refused.code == 1 and "needs the administrator role" in refused.err, argv
    assert desk.sent == [(who, *NOTICE)] * 3
    assert audited(desk.main.store, since) == [
        (f"controller:{who}", f"cli:exposure {verb}", "denied")
        for verb in ("enable", "enable", "disable")
    ]
    with desk.main.client(who) as client:
        assert client.post("/v1/ops/exposure/disable").status_code == 403
    assert published(desk) == kept


# -- node add --code ---------------------------------------------------------------


def test_node_add_code_from_a_workstation_prints_a_code_that_joins(desk: Desk) -> None:
    store = desk.main.store
    since = len(store.list_audit())
    typed = {
        (where, fmt): (desk.at_ws("fuzz", *argv) if where == "ws" else desk.at_main(*argv))
        for where in ("ws", "main")
        for fmt in ("text", "json")
        for argv in [
            ("node", "add", "--code", "--ttl", "30m", *(["--json"] if fmt == "json" else []))
        ]
    }
    assert all(t.code == 0 for t in typed.values()), typed
    remote, local = json.loads(typed["ws", "json"].out), json.loads(typed["main", "json"].out)
    assert list(remote) == list(local) == ["code", "id", "ca_fingerprint", "expires_at", "join"]
    assert remote["ca_fingerprint"] == local["ca_fingerprint"]
    assert remote["join"].rsplit(" ", 1)[0] == local["join"].rsplit(" ", 1)[0]
    assert remote["join"].endswith(" " + remote["code"])

    def plain(out: str) -> str:
        return re.sub(r"until \S+\): \S+", "until T): C", re.sub(r"LI1-\S+", "C", out))

    assert plain(typed["ws", "text"].out) == plain(typed["main", "text"].out)
    assert typed["ws", "text"].err == typed["main", "text"].err == ""
    assert audited(store, since).count(("controller:fuzz", "node.join.code", "ok")) == 2

    ca = ca_of(desk)
    code = JoinCode.parse(remote["code"])
    assert code.names_ca(ca.fingerprint)
    identity = load_identity(desk.main.home.identity_file)
    assert identity is not None
    challenges, node_id = joining.Challenges(), new_node_id()
    csr = pki.make_csr(pki.new_key(), node_id).decode()
    nonce = challenges.issue()
    proof = code.prove(
        nonce=nonce, csr_pem=csr, ca_fingerprint=ca.fingerprint, main_id=identity.node_id
    )
    ask = joining.JoinAsk(code.code_id, nonce, proof, csr, node_id, "joined", "10.0.0.7:8444")
    joined = joining.admit(
        store, ca, identity.node_id, challenges, joining.GuessBudget(), ask, lambda why: None
    )
    pki.verify_issued_by(pki.load_cert(joined.certificate), ca.cert)
    assert "joined" in [n.name for n in store.list_nodes()]


def test_node_add_code_with_a_bad_ttl_is_refused_alike_and_makes_no_code(desk: Desk) -> None:
    before = len(desk.main.store.list_audit())
    for ttl in ("soon", "8d"):
        remote = desk.at_ws("fuzz", "node", "add", "--code", "--ttl", ttl)
        same(remote, desk.at_main("node", "add", "--code", "--ttl", ttl))
        assert remote.code == 2, remote.err
    assert desk.sent == []
    with desk.main.client("fuzz") as admin:
        for ttl_s in (0, 8 * 86400, "soon"):
            assert admin.post("/v1/ops/join-codes", json={"ttl_s": ttl_s}).status_code == 422
    assert len(desk.main.store.list_audit()) == before


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["n1", "--ssh", "host.example"], "node add --ssh"),
        (["--address", "10.0.0.9:8444", "--fingerprint", "ab" * 32], "node add"),
        ([], "node add"),
    ],
)
def test_node_add_over_ssh_or_to_an_address_runs_only_on_the_main(
    desk: Desk, argv: list[str], command: str
) -> None:
    """Even an administrator's controller: refused here, exit 3, saying it
    runs only on the main; the main hears only the notice and audits it."""
    before, since = store_state(desk.main.store), len(desk.main.store.list_audit())
    refused = desk.at_ws("fuzz", "node", "add", *argv)
    assert refused.code == 3, refused.err
    said = " ".join(refused.err.split())
    assert f"`{command}` runs only on the main itself, never from a controller" in said
    assert "`letsinfer node add --code` makes a join code instead" in said
    assert "Only a notice was sent to the main fuzz" in said
    assert desk.sent == [("fuzz", *NOTICE)]
    assert audited(desk.main.store, since) == [("controller:fuzz", f"cli:{command}", "denied")]
    assert store_state(desk.main.store) == before


def test_less_than_an_administrator_may_not_make_a_join_code(desk: Desk) -> None:
    since = len(desk.main.store.list_audit())
    for who in ("op", "watcher"):
        refused = desk.at_ws(who, "node", "add", "--code")
        assert refused.code == 1 and "needs the administrator role" in refused.err
    assert desk.sent == [("op", *NOTICE), ("watcher", *NOTICE)]
    assert audited(desk.main.store, since) == [
        ("controller:op", "cli:node add", "denied"),
        ("controller:watcher", "cli:node add", "denied"),
    ]
    with desk.main.client("op") as op:
        assert op.post("/v1/ops/join-codes", json={"ttl_s": 60}).status_code == 403


def test_a_controller_s_exposure_change_is_served_on_the_gateway_s_loop(tmp_path: Path) -> None:
    """The control plane asks on its own thread's loop; the running node's
    exposed listener changes on the gateway's loop, which owns it (before
    the node started: nothing to change, the start applies the file)."""
    import asyncio
    import threading

    from letsinfer.config import GatewaySettings
    from letsinfer.exposure.serving import ExposureRunner
    from letsinfer.home import Home

    runner = ExposureRunner(Home.under(tmp_path / "main"), GatewaySettings())
    assert asyncio.run(runner.apply_from_control())["listening"] is False  # not started
    gateway = asyncio.new_event_loop()
    thread = threading.Thread(target=gateway.run_forever)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(runner.start(object()), gateway).result(10)
        applied_on: list[asyncio.AbstractEventLoop] = []
        apply = runner.apply

        async def watched() -> dict[str, object]:
            applied_on.append(asyncio.get_running_loop())
            return await apply()

        runner.apply = watched  # type: ignore[method-assign]
        state = asyncio.run(runner.apply_from_control())
        assert applied_on == [gateway] and state == runner.state()
    finally:
        gateway.call_soon_threadsafe(gateway.stop)
        thread.join(10)
        gateway.close()
