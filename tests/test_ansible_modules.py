"""The collection's modules and plugins: their decisions against a fake node,
and the process sweep against real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.letsinfer.cluster.plugins.filter.identity import identity_problem
from ansible_collections.letsinfer.cluster.plugins.filter.inventory import (
    address_kind,
    network_kind,
)
from ansible_collections.letsinfer.cluster.plugins.module_utils.letsinfer_cli import (
    CliError,
    LetsinferCli,
    processes_mentioning,
    terminate,
)
from ansible_collections.letsinfer.cluster.plugins.modules.letsinfer_enrollment import (
    Enrollment,
    EnrollmentError,
)
from ansible_collections.letsinfer.cluster.plugins.modules.letsinfer_model import (
    ModelError,
    Models,
)
from ansible_collections.letsinfer.cluster.plugins.modules.letsinfer_node import Node
from ansible_collections.letsinfer.cluster.plugins.test.inventory import (
    ip_address,
    ip_network,
)


class FakeNode:
    """Answers letsinfer commands like a node would, and records the mutating ones."""

    def __init__(self, **state: Any) -> None:
        self.state = {"initialised": False, "running": False, "role": None, **state}
        self.models: list[dict[str, Any]] = []
        self.calls: list[list[str]] = []
        self.requests: list[dict[str, Any]] = []
        self.nodes: list[dict[str, Any]] = []
        self.has_node_commands = True

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        args = argv[1:]
        if args[:1] == ["--home"]:
            args = args[2:]
        if args == ["--version"]:
            return 0, "letsinfer, version 0.1.0\n", ""
        if args == ["status", "--json"]:
            return 0, json.dumps(self.state), ""
        if args == ["model", "list", "--json"]:
            return 0, json.dumps(self.models), ""
        self.calls.append(args)
        if args[:3] == ["service", "init", "--json"]:
            self.state.update(initialised=True, role="main")
            return 0, json.dumps({"api_key": "li-secret"}), ""
        if args[:3] == ["service", "start", "--json"]:
            key = None if self.state["initialised"] else "li-first"
            self.state.update(initialised=True, running=True, role=self.state["role"] or "main")
            return 0, json.dumps({"started": True, "api_key": key}), ""
        if args[:2] == ["service", "stop"]:
            self.state["running"] = False
            return 0, "{}", ""
        if args[:3] == ["service", "restart", "--json"]:
            was = self.state["running"]
            self.state["running"] = True
            return 0, json.dumps({"restarted": was, "engines_kept": 2 if was else 0}), ""
        if args[:2] == ["model", "add"]:
            if args[2] == "broken":
                return 1, "", "Error: not a GGUF file"
            aliases = [args[i + 1] for i, a in enumerate(args) if a == "--alias"]
            self.models.append({"name": args[2], "aliases": aliases})
            return 0, "added", ""
        if args[:2] == ["model", "pull"]:
            opt = {a: args[i + 1] for i, a in enumerate(args) if a.startswith("--")}
            self.models.append(
                {
                    "name": opt["--name"],
                    "aliases": [],
                    "repo": args[2],
                    "commit": opt["--revision"],
                    "files": [{"name": opt["--file"]}],
                }
            )
            return 0, "pulled", ""
        if args[:1] == ["node"]:
            if not self.has_node_commands:
                return 2, "", "Error: No such command 'node'."
            if args[1:] == ["--help"]:
                return 0, "", ""
            if args[1] == "init":
                self.state.update(initialised=True, role="candidate", fingerprint="ab12")
                return 0, "certificate fingerprint: ab12\n", ""
            if args[1:] == ["list", "--json"]:
                return 0, json.dumps(self.nodes), ""
            if args[1:] == ["requests", "--json"]:
                return 0, json.dumps(self.requests), ""
            if args[1] == "add":
                pinned = args[args.index("--fingerprint") + 1] if "--fingerprint" in args else None
                return 0, json.dumps({"id": "r1", "address": args[3], "pinned": pinned}), ""
            if args[1] == "accept":
                [req] = [r for r in self.requests if r["id"] == args[2]]
                pinned = args[args.index("--ca-fingerprint") + 1]
                if pinned != req["ca_fingerprint"]:
                    return 1, "", "Error: request comes from another cluster"
                self.state.update(
                    role="child", main=req["main_address"], ca_fingerprint=req["ca_fingerprint"]
                )
                self.requests.remove(req)
                return 0, "", ""
            if args[1] == "reject":
                self.requests = [r for r in self.requests if r["id"] != args[2]]
                return 0, "", ""
        return 2, "", f"unexpected: {args}"


@pytest.fixture
def exe(tmp_path: Path) -> str:
    path = tmp_path / "letsinfer"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def node(fake: FakeNode, exe: str, check: bool = False) -> Node:
    return Node(LetsinferCli(fake, exe), check_mode=check, find=lambda paths: [], kill=None)


def test_node_started_starts_once_and_reports_unchanged_after(exe: str) -> None:
    fake = FakeNode(initialised=True, role="main")
    first = node(fake, exe).ensure("started")
    assert first["changed"] is True and first["node"]["running"] is True
    assert "api_key" not in first  # an initialised main gets no new key
    second = node(fake, exe).ensure("started")
    assert second["changed"] is False
    assert [c[:2] for c in fake.calls] == [["service", "start"]]


def test_node_restarted_keeps_engines_through_service_restart(exe: str) -> None:
    fake = FakeNode(initialised=True, role="main", running=True)
    done = node(fake, exe).ensure("restarted", timeout=90)
    assert done["changed"] is True and done["restart"]["engines_kept"] == 2
    assert fake.calls == [
        ["service", "restart", "--json", "--timeout", "90", "--stop-timeout", "90"]
    ], "never a stop then a start, which would stop the engines"
    stopped = FakeNode(initialised=True, role="main")
    node(stopped, exe).ensure("restarted", unit="letsinfer")
    assert stopped.calls[0][-2:] == ["--unit", "letsinfer"]
    fresh = FakeNode(initialised=True, role="main")
    node(fresh, exe).ensure("restarted")
    assert [c[:2] for c in fresh.calls] == [["service", "start"]]


def test_node_check_mode_predicts_without_acting(exe: str) -> None:
    fake = FakeNode()
    result = node(fake, exe, check=True).ensure("started")
    assert result["changed"] is True
    assert result["diff"] == {
        "before": {"initialised": False, "running": False},
        "after": {"initialised": True, "running": True},
    }
    assert fake.calls == []


def test_node_initialised_returns_the_first_key_once(exe: str) -> None:
    fake = FakeNode()
    first = node(fake, exe).ensure("initialised", name="main")
    assert first["changed"] is True and first["api_key"] == "li-secret"
    assert fake.calls == [["service", "init", "--json", "--name", "main"]]
    again = node(fake, exe).ensure("initialised", name="main")
    assert again["changed"] is False and "api_key" not in again


def test_node_stopped_sweeps_leftovers_even_without_the_cli(tmp_path: Path) -> None:
    killed: list[list[int]] = []
    missing = str(tmp_path / "gone" / "letsinfer")
    n = Node(
        LetsinferCli(FakeNode(), missing),
        find=lambda paths: [4242] if paths == ["/opt/letsinfer"] else [],
        kill=killed.append,
    )
    result = n.ensure("stopped", sweep_paths=["/opt/letsinfer"])
    assert result["changed"] is True and result["swept"] == [4242]
    assert killed == [[4242]]
    assert result["installed"] is False and "node" not in result


def test_node_start_without_letsinfer_fails_with_the_reason(tmp_path: Path) -> None:
    n = node(FakeNode(), str(tmp_path / "nope"))
    with pytest.raises(CliError, match="not installed"):
        n.ensure("started")


def test_model_present_adds_once_with_diff(exe: str, tmp_path: Path) -> None:
    fake = FakeNode(initialised=True, role="main")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    models = Models(LetsinferCli(fake, exe))
    first = models.ensure("qwen", str(gguf), ["q"])
    assert first["changed"] is True
    assert first["diff"]["after"] == "qwen\n" and first["diff"]["before"] == ""
    assert fake.calls == [["model", "add", "qwen", "--gguf", str(gguf), "--alias", "q"]]
    assert models.ensure("qwen", str(gguf), ["q"])["changed"] is False
    with pytest.raises(ModelError, match="cannot change aliases"):
        models.ensure("qwen", str(gguf), ["other"])


def test_model_refuses_a_missing_file_even_in_check_mode(exe: str, tmp_path: Path) -> None:
    fake = FakeNode(initialised=True, role="main")
    with pytest.raises(ModelError, match="no such file"):
        Models(LetsinferCli(fake, exe), check_mode=True).ensure("x", str(tmp_path / "no.gguf"))
    assert fake.calls == []


def test_model_of_a_name_the_site_uses_for_other_bytes_is_refused_saying_which(
    exe: str, tmp_path: Path
) -> None:
    # A new main already serves its tiny model; a bundle brings another "tiny".
    fake = FakeNode(initialised=True, role="main")
    fake.models.append({"name": "tiny", "aliases": [], "sha256": "a" * 64, "repo": None})
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    models = Models(LetsinferCli(fake, exe))

    for check_mode in (True, False):
        models.check_mode = check_mode
        with pytest.raises(ModelError) as refused:
            models.ensure("tiny", str(gguf), sha256="B" * 64)
        assert "model 'tiny' already exists and serves sha256 " + "a" * 64 in str(refused.value)
        assert "b" * 64 in str(refused.value) and "nothing changed" in str(refused.value)
    assert fake.calls == []
    # The same bytes under that name are the model already served.
    assert models.ensure("tiny", str(gguf), sha256="A" * 64)["changed"] is False


def test_model_from_a_hub_repository_is_pulled_with_its_provenance_once(exe: str) -> None:
    fake = FakeNode(initialised=True, role="main")
    commit = "c0" * 20
    models = Models(LetsinferCli(fake, exe))
    name = "org/tiny-gguf:tiny-gguf-Q8_0"

    first = models.ensure_pulled(name, "org/tiny-gguf", commit, "tiny-gguf-Q8_0.gguf")

    assert first["changed"] is True
    pull = ["model", "pull", "org/tiny-gguf", "--file", "tiny-gguf-Q8_0.gguf"]
    assert fake.calls == [[*pull, "--revision", commit, "--name", name]]
    assert models.ensure_pulled(name, "org/tiny-gguf", commit, "tiny-gguf-Q8_0.gguf") == {
        "changed": False,
        "model": fake.models[0],
        "diff": first["diff"] | {"before": f"{name}\n"},
    }
    with pytest.raises(ModelError, match=f"serves org/tiny-gguf@{commit} .*not org/tiny-gguf@"):
        models.ensure_pulled(name, "org/tiny-gguf", "d1" * 20, "tiny-gguf-Q8_0.gguf")
    assert len(fake.calls) == 1


def test_model_add_failure_carries_letsinfer_s_message(exe: str, tmp_path: Path) -> None:
    gguf = tmp_path / "b.gguf"
    gguf.write_text("x")
    with pytest.raises(CliError, match="not a GGUF file"):
        Models(LetsinferCli(FakeNode(initialised=True), exe)).ensure("broken", str(gguf))


def test_node_started_as_a_candidate_initialises_it_first(exe: str) -> None:
    fake = FakeNode()
    first = node(fake, exe).ensure("started", name="n1", role="candidate")
    assert first["changed"] is True and "api_key" not in first
    assert first["node"]["role"] == "candidate" and first["node"]["fingerprint"] == "ab12"
    assert [c[:2] for c in fake.calls] == [["node", "init"], ["service", "start"]]
    assert fake.calls[0] == ["node", "init", "--name", "n1"]
    assert node(fake, exe).ensure("started", role="candidate")["changed"] is False


def test_node_initialised_as_a_candidate_and_check_mode(exe: str) -> None:
    fake = FakeNode()
    predicted = node(fake, exe, check=True).ensure("initialised", role="candidate")
    assert predicted["changed"] is True and predicted["node"]["role"] == "candidate"
    assert fake.calls == []
    done = node(fake, exe).ensure("initialised", name="n1", role="candidate")
    assert done["changed"] is True and fake.calls == [["node", "init", "--name", "n1"]]
    assert node(fake, exe).ensure("initialised", role="candidate")["changed"] is False


def test_node_never_turns_a_main_into_a_candidate(exe: str) -> None:
    fake = FakeNode(initialised=True, running=True, role="main")
    with pytest.raises(CliError, match="already is a main node"):
        node(fake, exe).ensure("started", role="candidate")
    assert fake.calls == []


CA_MAIN = "a1" * 32  # the inventory's main's cluster CA
CA_OTHER = "b2" * 32  # a LAN host's own main


def request(rid: str, ca: str, expires: str = "2026-01-01T00:00:00+00:00", **extra: Any) -> Any:
    return {
        "id": rid,
        "ca_fingerprint": ca,
        "main": "main",
        "main_address": "10.0.0.1:8443",
        "expires": expires,
        **extra,
    }


def test_enrollment_in_check_mode_predicts_for_a_node_not_yet_set_up(
    exe: str, tmp_path: Path
) -> None:
    missing = LetsinferCli(FakeNode(), str(tmp_path / "absent"))
    assert Enrollment(missing, check_mode=True).request("10.0.0.2:8444")["changed"] is True
    assert Enrollment(missing, check_mode=True).accept("")["changed"] is True
    fake = FakeNode(initialised=True, running=True, role="candidate")
    fake.requests = [request("planted", CA_OTHER)]
    predicted = Enrollment(LetsinferCli(fake, exe), check_mode=True).accept(CA_MAIN)
    assert predicted["changed"] and [r["id"] for r in predicted["rejected"]] == ["planted"]
    assert fake.calls == [["node", "--help"], ["node", "requests", "--json"]]  # nothing done


def test_enrollment_accepts_the_newest_request_of_the_main_s_cluster_and_rejects_the_rest(
    exe: str,
) -> None:
    """A LAN host's request that names the main (its name and address) and
    expires last is still rejected: only the CA fingerprint counts."""
    cand = FakeNode(initialised=True, running=True, role="candidate")
    cand.requests = [
        request("old", CA_MAIN, "2026-01-01T00:00:00+00:00"),
        request("new", CA_MAIN, "2026-01-01T00:10:00+00:00"),
        request("planted", CA_OTHER, "2027-01-01T00:00:00+00:00"),
    ]
    result = Enrollment(LetsinferCli(cand, exe)).accept(f"SHA256:{CA_MAIN.upper()}")
    assert result["changed"] and result["request"]["id"] == "new"
    assert sorted(r["id"] for r in result["rejected"]) == ["old", "planted"]
    assert cand.calls[-3:] == [
        ["node", "reject", "old"],
        ["node", "reject", "planted"],
        ["node", "accept", "new", "--ca-fingerprint", CA_MAIN],
    ]
    assert cand.state["ca_fingerprint"] == CA_MAIN and cand.requests == []


def test_enrollment_takes_exactly_the_request_the_main_sent(exe: str) -> None:
    """A request with the main's (public) CA and a later expiry never takes the
    place of the one the main just sent: the accept step takes its id."""
    cand = FakeNode(initialised=True, running=True, role="candidate")
    cand.requests = [
        request("sent", CA_MAIN, "2026-01-01T00:10:00+00:00"),
        request("late", CA_MAIN, "2026-01-08T00:00:00+00:00"),
    ]
    result = Enrollment(LetsinferCli(cand, exe)).accept(CA_MAIN, request_id="sent")
    assert result["request"]["id"] == "sent" and [r["id"] for r in result["rejected"]] == ["late"]
    assert cand.calls[-2:] == [
        ["node", "reject", "late"],
        ["node", "accept", "sent", "--ca-fingerprint", CA_MAIN],
    ]

    gone = FakeNode(initialised=True, running=True, role="candidate")
    gone.requests = [request("late", CA_MAIN, "2026-01-08T00:00:00+00:00")]
    with pytest.raises(EnrollmentError, match="no pending enrollment request sent from the "):
        Enrollment(LetsinferCli(gone, exe)).accept(CA_MAIN, request_id="sent")
    assert gone.state["role"] == "candidate"
    assert ["node", "accept", "late", "--ca-fingerprint", CA_MAIN] not in gone.calls


def test_enrollment_is_bound_to_the_main_s_ca_and_never_adopts(exe: str) -> None:
    fake = FakeNode(initialised=True, running=True, role="candidate")
    fake.requests = [request("planted", CA_OTHER)]
    enrollment = Enrollment(LetsinferCli(fake, exe))
    with pytest.raises(
        EnrollmentError,
        match=f"no pending enrollment request from the cluster of CA sha256:{CA_MAIN} \\(rej",
    ):
        enrollment.accept(CA_MAIN)
    assert fake.requests == [] and fake.state["role"] == "candidate"
    with pytest.raises(EnrollmentError, match="not a SHA-256 fingerprint"):
        enrollment.accept("10.0.0.1")

    fake.requests = [request("r7", CA_MAIN)]
    assert enrollment.accept(CA_MAIN)["changed"] is True
    assert enrollment.accept(CA_MAIN)["changed"] is False  # now a child of that cluster
    with pytest.raises(EnrollmentError, match="explicit adoption"):
        enrollment.accept(CA_OTHER)

    main = FakeNode(initialised=True, running=True, role="main")
    with pytest.raises(EnrollmentError, match="is a main node"):
        Enrollment(LetsinferCli(main, exe)).accept(CA_MAIN)


def test_enrollment_request_is_sent_once(exe: str) -> None:
    fake = FakeNode(initialised=True, running=True, role="main")
    enrollment = Enrollment(LetsinferCli(fake, exe))
    sent = enrollment.request("10.0.0.2:8444", fingerprint="sha256:ab12")
    assert sent["changed"] is True and sent["request"]["pinned"] == "sha256:ab12"
    fake.nodes = [{"name": "n1", "address": "10.0.0.2:8444"}]
    assert enrollment.request("10.0.0.2:8444")["changed"] is False


def test_enrollment_says_when_letsinfer_lacks_the_commands(exe: str) -> None:
    fake = FakeNode(initialised=True, role="main")
    fake.has_node_commands = False
    with pytest.raises(EnrollmentError, match="needs a release with the trust layer"):
        Enrollment(LetsinferCli(fake, exe)).request("10.0.0.2:8444")


def node_json(role: str, name: str, cluster: str | None = None) -> dict[str, Any]:
    return {"node_id": "0123", "name": name, "role": role, "cluster": cluster}


def test_a_node_already_on_a_host_must_be_the_inventory_s() -> None:
    main = node_json("main", "main", CA_MAIN)
    stray = node_json("main", "runner", CA_OTHER)  # `./dev up` on the machine
    fits = [
        ({}, "main", "main", {}, ""),  # a fresh host
        (main, "main", "main", main, ""),
        (stray, "main", "main", stray, f"sha256:{CA_OTHER}"),  # pinned: taken explicitly
        (node_json("candidate", "n1"), "child", "n1", {}, ""),
        (node_json("child", "n1", CA_MAIN), "child", "n1", main, ""),
    ]
    for found, role, host, main_found, pinned in fits:
        assert identity_problem(found, role, host, main_found, pinned) == "", (found, role)

    def problem(found: Any, role: str, host: str, main_found: Any, pinned: str = "") -> str:
        said = identity_problem(found, role, host, main_found, pinned)
        assert said.startswith(f"{host} already holds a letsinfer {found['role']}"), said
        return said

    assert "which this inventory did not make" in problem(stray, "main", "main", stray)
    assert "not the main of the inventory's cluster" in problem(
        main, "main", "main", main, CA_OTHER
    )
    assert "makes main a child" in problem(main, "child", "main", {})
    assert "makes n1 the main" in problem(node_json("child", "n1", CA_MAIN), "main", "n1", {})
    other = node_json("child", "n2", CA_OTHER)
    assert f"than the inventory's (CA sha256:{CA_MAIN})" in problem(other, "child", "n2", main)
    assert "main has no node yet" in problem(other, "child", "n2", {})
    assert "another cluster" in problem(node_json("child", "n2", CA_MAIN), "child", "n2", stray)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("10.1.2.3", "ipv4"),
        ("fd00::1", "ipv6"),
        ("gpu-a.lab.example", "hostname"),
        ("999.1.1.1", "invalid"),
        ("bad_name", "invalid"),
        ("", "invalid"),
        ("-lead.example", "invalid"),
    ],
)
def test_address_kind(value: str, kind: str) -> None:
    assert address_kind(value) == kind


def test_network_checks() -> None:
    assert network_kind("10.0.0.0/8") == "ipv4" and network_kind("fd00::/8") == "ipv6"
    assert network_kind("10.0.0.0/33") == "invalid"
    assert ip_address("10.0.0.1", 4) and not ip_address("10.0.0.1", 6)
    assert ip_network("fd00::/8", 6) and not ip_network("lan", None)


def test_sweep_finds_and_ends_only_processes_mentioning_the_path(tmp_path: Path) -> None:
    marker = tmp_path / "opt-letsinfer"
    code = "import time; time.sleep(60)"
    ours = subprocess.Popen([sys.executable, "-c", code, str(marker / "bin")])
    other = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "elsewhere")])
    try:
        deadline = time.monotonic() + 10
        while ours.pid not in processes_mentioning([str(marker)]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        found = processes_mentioning([str(marker)])
        assert other.pid not in found
        terminate(found, grace=5)
        assert ours.wait(timeout=10) != 0
        assert other.poll() is None
        assert processes_mentioning([str(marker)]) == []
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()


def test_module_documentation_parses_and_states_check_mode() -> None:
    root = Path(__file__).resolve().parent.parent
    bindir = Path(sys.executable).parent
    names = [
        f"letsinfer.cluster.{m}"
        for m in ("letsinfer_node", "letsinfer_model", "letsinfer_enrollment", "warning")
    ]
    result = subprocess.run(
        [str(bindir / "ansible-doc"), "-t", "module", "--json", *names],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    for name in names:
        doc = docs[name]["doc"]
        assert doc["attributes"]["check_mode"]["support"] == "full"
        assert docs[name]["examples"] and docs[name]["return"]
    assert set(docs[names[0]]["doc"]["options"]) >= {"state", "executable", "home", "sweep_paths"}
