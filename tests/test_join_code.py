"""Join codes: their format, and the main's checks of a proof (guesses,
expiry, one use). The lab test (test_join_code_lab.py) runs them between
hosts, with a fake main and an attacker."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from letsinfer import config
from letsinfer.audit.anchor import open_authority
from letsinfer.authority import joining
from letsinfer.authority.bootstrap import init_main
from letsinfer.cli import cli
from letsinfer.home import Home
from letsinfer.identity import new_node_id
from letsinfer.store import AuthorityStore
from letsinfer.trust import pki
from letsinfer.trust.join_code import JoinCode, JoinCodeError
from letsinfer.trust.material import ClusterCA

FP = "ab" * 32


def test_a_code_reads_back_as_printed_in_any_case() -> None:
    code = JoinCode.new(FP)
    text = str(code)
    assert text.startswith("LI1-") and len(text) <= 64
    for shown in (text, text.lower(), f"  {text}\n"):
        again = JoinCode.parse(shown)
        assert (again.code_id, again.ca_prefix, again.secret) == (
            code.code_id,
            code.ca_prefix,
            code.secret,
        )
    assert code.names_ca(FP) and not code.names_ca("cd" * 32)
    assert str(code.secret) not in repr(code) and text not in repr(code)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "starts with LI1-"),
        ("LI2-AAAAAAAA-BBBB-CCCC", "starts with LI1-"),
        ("LI1-AAAAAAAA-" + "B" * 26, "has 4 parts separated by '-', this one has 3"),
        ("LI1-AAAA-" + "B" * 26 + "-" + "C" * 24, "id part has 4 characters, not 8"),
        ("LI1-AAAAAAAA-" + "B" * 25 + "-" + "C" * 24, "fingerprint part has 25 characters"),
        ("LI1-AAAAAAAA-" + "B" * 26 + "-" + "C" * 23 + "1", "secret part holds '1'"),
        ("LI1-AAAAAAAA-" + "B" * 26 + "-" + "C" * 24 + "-X", "this one has 5"),
    ],
)
def test_a_malformed_code_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(JoinCodeError, match=says.replace("(", r"\(")):
        JoinCode.parse(text)


def test_join_refuses_a_malformed_code_or_address_and_changes_nothing(tmp_path: Path) -> None:
    runner = CliRunner()
    home = tmp_path / "fresh"
    bad = runner.invoke(cli, ["--home", str(home), "join", "10.0.0.1", "LI1-NOPE"])
    assert bad.exit_code == 2 and "not a join code: a join code has 4 parts" in bad.output
    code = str(JoinCode.new(FP))
    bad = runner.invoke(cli, ["--home", str(home), "join", "10.0.0.1:http", code])
    assert bad.exit_code == 2 and "the port must be a number" in bad.output
    assert not (home / "etc").exists() and not (home / "var").exists()


class Main:
    def __init__(self, root: Path) -> None:
        self.home = Home.under(root)
        identity, _ = init_main(
            self.home, config.load(self.home.config_file), name="main", default_model=False
        )
        self.main_id = identity.node_id
        self.ca = ClusterCA(self.home, identity)
        self.fingerprint = pki.fingerprint(self.ca.cert)
        self.store: AuthorityStore = open_authority(self.home)
        self.challenges = joining.Challenges()
        self.budget = joining.GuessBudget()
        self.refusals: list[str] = []

    def code(self, ttl_s: float = 900) -> JoinCode:
        return joining.issue_code(self.store, self.fingerprint, ttl_s)[0]

    def ask(self, code: JoinCode, name: str) -> joining.JoinAsk:
        """What a candidate holding ``code`` sends."""
        node_id = new_node_id()
        csr = pki.make_csr(pki.new_key(), node_id).decode()
        nonce = self.challenges.issue()
        proof = code.prove(
            nonce=nonce, csr_pem=csr, ca_fingerprint=self.fingerprint, main_id=self.main_id
        )
        return joining.JoinAsk(code.code_id, nonce, proof, csr, node_id, name, "10.0.0.7:8444")

    def admit(self, ask: joining.JoinAsk) -> joining.Joined:
        return joining.admit(
            self.store,
            self.ca,
            self.main_id,
            self.challenges,
            self.budget,
            ask,
            self.refusals.append,
        )

    def children(self) -> list[str]:
        return [n.name for n in self.store.list_nodes() if n.role == "child"]

    def audit(self, action: str) -> list[tuple[str, str | None]]:
        return [(r.outcome, r.detail) for r in self.store.list_audit() if r.action == action]


@pytest.fixture
def main(tmp_path: Path) -> Iterator[Main]:
    m = Main(tmp_path / "main")
    try:
        yield m
    finally:
        m.store.close()


def test_a_code_enrolls_once(main: Main) -> None:
    code = main.code()
    joined = main.admit(main.ask(code, "n1"))
    cert = pki.load_cert(joined.certificate)
    pki.verify_issued_by(cert, main.ca.cert)
    assert pki.identity_of(cert).id == joined.node_id and main.children() == ["n1"]
    assert main.audit("node.join") == [("ok", f"join code {code.code_id}, agent at 10.0.0.7:8444")]

    with pytest.raises(joining.JoinRefused, match="used already") as again:
        main.admit(main.ask(code, "n2"))
    assert again.value.status == 409 and main.children() == ["n1"]
    assert main.refusals == ["join: code used already"]


def test_an_expired_code_is_refused(main: Main) -> None:
    code = main.code(ttl_s=0.05)
    time.sleep(0.1)
    with pytest.raises(joining.JoinRefused, match="expired") as refused:
        main.admit(main.ask(code, "n1"))
    assert refused.value.status == 410 and main.children() == []


def test_twenty_wrong_guesses_burn_the_code_and_enroll_nothing(main: Main) -> None:
    code = main.code()
    for _ in range(20):
        guess = replace(code, secret=JoinCode.new(FP).secret)
        with pytest.raises(joining.JoinRefused) as refused:
            main.admit(main.ask(guess, "intruder"))
        assert refused.value.status == 403
    # burnt after MAX_WRONG_PROOFS: now even the right secret is refused
    with pytest.raises(joining.JoinRefused, match="burnt"):
        main.admit(main.ask(code, "n1"))
    assert main.children() == []
    rec = main.store.get_join_code(code.code_id)
    assert rec is not None and rec.state == "burnt"
    assert rec.wrong_proofs == joining.MAX_WRONG_PROOFS
    assert main.audit("node.join") == [
        ("denied", f"join code burnt after {joining.MAX_WRONG_PROOFS} wrong proofs")
    ]
    assert main.refusals.count("join: wrong proof") == joining.MAX_WRONG_PROOFS


def test_wrong_guesses_are_bounded_across_all_codes(main: Main) -> None:
    """Unknown ids and wrong proofs on many codes, together: past the global
    bound every join is refused for a while, a right one too."""
    good = main.code()
    spent = 0
    while spent < joining.GLOBAL_WRONG_PROOFS:
        victim = main.code()
        for _ in range(joining.MAX_WRONG_PROOFS - 1):  # never burnt
            with pytest.raises(joining.JoinRefused):
                main.admit(main.ask(replace(victim, secret=JoinCode.new(FP).secret), "x"))
            spent += 1
        with pytest.raises(joining.JoinRefused, match="unknown join code"):
            main.admit(main.ask(JoinCode.new(main.fingerprint), "x"))
        spent += 1
    with pytest.raises(joining.JoinRefused, match="too many wrong join codes") as refused:
        main.admit(main.ask(good, "n1"))
    assert refused.value.status == 429 and refused.value.retry_after
    assert main.children() == []


def test_a_proof_needs_a_fresh_nonce_of_this_main(main: Main) -> None:
    code = main.code()
    ask = main.ask(code, "n1")
    other = joining.Challenges()  # another main's (or a restarted one's) nonce
    nonce = other.issue()
    forged = replace(
        ask,
        nonce=nonce,
        proof=code.prove(
            nonce=nonce, csr_pem=ask.csr, ca_fingerprint=main.fingerprint, main_id=main.main_id
        ),
    )
    with pytest.raises(joining.JoinRefused, match="not a fresh one"):
        main.admit(forged)
    # a proof is bound to its CSR: another key cannot ride on it
    swapped = replace(ask, csr=pki.make_csr(pki.new_key(), ask.node_id).decode())
    with pytest.raises(joining.JoinRefused, match="wrong join code"):
        main.admit(swapped)
    assert main.children() == []


def test_the_main_keeps_no_secret_of_a_code(main: Main) -> None:
    code = main.code()
    text = str(code)
    main.store.close()
    raw = b"".join(p.read_bytes() for p in main.home.database.parent.glob("*.db*"))
    secret_part = text.rsplit("-", 1)[1].encode()
    assert code.code_id.encode() in raw  # it is there, by id
    assert (
        secret_part not in raw and code.secret not in raw and code.secret.hex().encode() not in raw
    )
    main.store = open_authority(main.home)


def test_node_add_code_refuses_a_bad_ttl_and_makes_no_code(main: Main) -> None:
    root = str(main.home.etc.parent)
    runner = CliRunner()
    for ttl, says in (("soon", "is not a duration"), ("8d", "between 1s and 7d")):
        bad = runner.invoke(cli, ["--home", root, "node", "add", "--code", "--ttl", ttl])
        assert bad.exit_code == 2 and says in bad.output, bad.output
    bad = runner.invoke(cli, ["--home", root, "node", "add", "--code", "--address", "h:8444"])
    assert bad.exit_code == 2 and "--code takes no NAME, --address or --fingerprint" in bad.output
    assert main.audit("node.join.code") == []
    made = runner.invoke(cli, ["--home", root, "node", "add", "--code", "--ttl", "30s", "--json"])
    assert made.exit_code == 0, made.output
    code = JoinCode.parse(json.loads(made.output)["code"])
    assert code.names_ca(main.fingerprint)
    assert [o for o, _ in main.audit("node.join.code")] == ["ok"]
