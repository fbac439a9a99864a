"""An air-gapped site onboarded with Ansible from one signed bundle: bundle.yml
and site.yml against lab hosts that have no route to any package index.

The workstation verifies the bundle before any host gets it; hosts install
letsinfer from its wheelhouse with pip --no-index; the main imports it into
its mirror and serves its model. A tampered bundle stops the play with the
reason before any host is touched. Needs root, like CI (the lab's other
playbooks are in tests/test_ansible_lab.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from letsinfer.engines.tinymodel import SENTENCE
from letsinfer.release.keys import generate
from tests.lab import wheelhouse
from tests.lab.netns import Lab, printed, running_lab
from tests.nodes import letsinfer

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOSTS = ("main", "n1")  # inventories/lab
MODEL = "site-tiny"
# What letsinfer may have written on a host: install root (bundles included),
# config, state, runtime files.
LETSINFER_PATHS = "/opt/letsinfer /etc/letsinfer /var/lib/letsinfer /run/letsinfer"

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0 or not all(shutil.which(t) for t in ("sshd", "nft", "nc", "nsenter")),
        reason="the lab needs root, openssh-server, nftables, netcat-openbsd and util-linux",
    ),
    pytest.mark.timeout(
        1200
    ),  # a bundle, then check, bundle.yml and site.yml runs (twice) in a test's setup
]


@dataclass(frozen=True)
class Bundle:
    path: Path
    id: str
    key: Path  # the signing key, on the connected machine
    public_key: str
    wheels: dict[str, str]  # normalised distribution name -> version


def _dist(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Bundle:
    """A whole bundle, as a connected machine makes it: letsinfer's wheelhouse,
    the bundled llama.cpp engine and a model."""
    folder = tmp_path_factory.mktemp("carry")
    key = folder / "site.key"
    public = generate(key).text
    out = folder / "site.tar"
    made = letsinfer(
        folder / "connected",
        "bundle",
        "create",
        "--out",
        str(out),
        "--key",
        str(key),
        "--model",
        f"{MODEL}={tiny_gguf}",
        "--runtime",
        "xllamacpp",
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    checked = letsinfer(folder / "w", "bundle", "verify", str(out), "--key", public, "--json")
    assert checked.returncode == 0, checked.stderr
    with tarfile.open(out) as tar:
        wheels = [
            Path(n).name
            for n in tar.getnames()
            if n.startswith("wheelhouse/") and n.endswith(".whl")  # (not its signed list)
        ]
    versions = {_dist(w.split("-")[0]): w.split("-")[1] for w in wheels}
    return Bundle(out, json.loads(checked.stdout)["bundle"], key, public, versions)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab(list(HOSTS)) as the_lab:
        yield the_lab


def playbook(
    lab: Lab, name: str, bundle_file: Path, public_key: str, *args: str
) -> subprocess.CompletedProcess[str]:
    settings = {
        "bundle_file": str(bundle_file),
        "node_release_trusted_keys": [public_key],
        "main_placements": [],  # the lab's default places a model on n1: not needed here
    }
    extra = Path(lab.workdir) / f"{name}-{bundle_file.parent.name}.json"
    extra.write_text(json.dumps(settings))
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "LETSINFER_LAB_PREFIX": lab.prefix,
        "LETSINFER_LAB_WHEELHOUSE": "",  # no wheels but the bundle's
        "ANSIBLE_FORCE_COLOR": "0",
    }
    return subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            *("-i", "inventories/lab", f"playbooks/{name}", "-e", f"@{extra}"),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )


def sh(lab: Lab, host: str, command: str) -> str:
    return printed(lab.ssh(host, command))


def letsinfer_files(lab: Lab) -> dict[str, str]:
    """Every path letsinfer may write on each host, with content hashes."""
    listing = f"find {LETSINFER_PATHS} -exec sha256sum {{}} + 2>/dev/null; find {LETSINFER_PATHS}"
    return {h: sh(lab, h, f"({listing}) 2>/dev/null | sort; true") for h in HOSTS}


def changed(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+: ok=\d+\s+changed=(\d+)", result.stdout, re.M)
    }


def no_route(namespace: str, address: str) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with IPRoute(netns=namespace) as ipr:
        try:
            ipr.route("get", dst=address, family=family)
        except NetlinkError as exc:
            return exc.code == 101  # ENETUNREACH
    return False


def gateway_answer(lab: Lab) -> subprocess.CompletedProcess[str]:
    """The bundled model's answer through the main's gateway, from the LAN."""
    key = (Path(lab.workdir) / "api-key").read_text().strip()
    request = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hi?"}]})
    url = f"http://{lab.hosts['main'].address}:8000/v1/chat/completions"
    return subprocess.run(
        lab.in_ctl(
            *("curl", "-sf", "-m", "60", url, "-H", f"Authorization: Bearer {key}"),
            *("-H", "Content-Type: application/json", "-d", request),
        ),
        capture_output=True,
        text=True,
    )


def content(answer: subprocess.CompletedProcess[str]) -> str:
    assert answer.returncode == 0, answer.stderr
    return str(json.loads(answer.stdout)["choices"][0]["message"]["content"])


def ask_the_gateway(lab: Lab) -> str:
    return content(gateway_answer(lab))


def flip_a_byte_in_the_letsinfer_wheel(bundle: Path, dest: Path) -> None:
    """A changed wheel, with a fresh outer checksum: as a careful attacker would."""
    with tarfile.open(bundle) as tar:
        wheel = next(m for m in tar.getmembers() if re.match(r"wheelhouse/letsinfer-", m.name))
    data = bytearray(bundle.read_bytes())
    data[wheel.offset_data + 100] ^= 1
    dest.write_bytes(bytes(data))
    digest = subprocess.run(["sha256sum", str(dest)], capture_output=True, text=True, check=True)
    dest.with_name(dest.name + ".sha256").write_text(digest.stdout.split()[0] + "  site.tar\n")


@pytest.fixture
def new_hosts(lab: Lab) -> Iterator[Lab]:
    """Hosts letsinfer has not touched: the module's lab before it is onboarded,
    else a lab of their own (on a running site the node itself changes its files)."""
    if not any(letsinfer_files(lab).values()):
        yield lab
        return
    with running_lab(list(HOSTS)) as fresh:
        yield fresh


def test_a_tampered_bundle_stops_site_yml_before_any_host_is_touched(
    new_hosts: Lab, bundle: Bundle, tmp_path: Path
) -> None:
    lab = new_hosts
    tampered = tmp_path / "site.tar"
    flip_a_byte_in_the_letsinfer_wheel(bundle.path, tampered)
    before = letsinfer_files(lab)

    result = playbook(lab, "site.yml", tampered, bundle.public_key)

    out = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert f"Refused the bundle {tampered} on this workstation, so no host was touched" in out
    assert "does not match its sha256 in the manifest" in out
    assert "Install letsinfer" not in out  # the play stopped before the nodes' play
    assert letsinfer_files(lab) == before


@dataclass(frozen=True)
class Runs:
    """The onboarding runs, and what the tests check of the site they made, read
    right after them (the upgrade test moves the site to another release)."""

    untouched_by_check: bool
    check: subprocess.CompletedProcess[str]
    bundle: subprocess.CompletedProcess[str]
    site: subprocess.CompletedProcess[str]
    pip_lists: dict[str, subprocess.CompletedProcess[str]]  # host -> `pip list --format json`
    configs: dict[str, subprocess.CompletedProcess[str]]  # host -> its config.toml
    mirrored: subprocess.CompletedProcess[str]  # the main's `mirror list --bundles --json`
    answer: subprocess.CompletedProcess[str]  # the gateway's, to a chat request
    # then bundle.yml and site.yml again, with the main's status before and after
    status_before_again: subprocess.CompletedProcess[str]
    bundle_again: subprocess.CompletedProcess[str]
    site_again: subprocess.CompletedProcess[str]
    status_after_again: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def onboarded(lab: Lab, bundle: Bundle) -> Runs:
    """site.yml --check, then bundle.yml and site.yml, as an operator of an
    air-gapped site runs them on new hosts; then both again, as they are run
    once more on a site that has not changed."""
    before = letsinfer_files(lab)
    check = playbook(lab, "site.yml", bundle.path, bundle.public_key, "--check")
    untouched = letsinfer_files(lab) == before
    first = playbook(lab, "bundle.yml", bundle.path, bundle.public_key)
    site = playbook(lab, "site.yml", bundle.path, bundle.public_key, "-v")
    pip_lists = {
        h: lab.ssh(h, "/opt/letsinfer/current/bin/python -m pip list --format json") for h in HOSTS
    }
    configs = {h: lab.ssh(h, "cat /etc/letsinfer/config.toml") for h in HOSTS}
    mirrored = lab.ssh("main", "/opt/letsinfer/current/bin/letsinfer mirror list --bundles --json")
    answer = gateway_answer(lab)
    main_status = "/opt/letsinfer/current/bin/letsinfer status --json"
    status_before = lab.ssh("main", main_status)
    bundle_again = playbook(lab, "bundle.yml", bundle.path, bundle.public_key)
    site_again = playbook(lab, "site.yml", bundle.path, bundle.public_key)
    status_after = lab.ssh("main", main_status)
    return Runs(
        untouched,
        check,
        first,
        site,
        pip_lists,
        configs,
        mirrored,
        answer,
        status_before,
        bundle_again,
        site_again,
        status_after,
    )


def test_bundle_and_site_onboard_hosts_that_have_no_route_to_any_index(
    lab: Lab, bundle: Bundle, onboarded: Runs
) -> None:
    for host in HOSTS:
        for address in ("1.1.1.1", "151.101.0.223", "2606:4700:4700::1111"):
            assert no_route(lab.hosts[host].namespace, address), (host, address)

    assert onboarded.check.returncode == 0, onboarded.check.stdout
    assert onboarded.untouched_by_check
    assert onboarded.bundle.returncode == 0, onboarded.bundle.stdout
    assert "letsinfer is not installed on main yet" in onboarded.bundle.stdout
    assert onboarded.site.returncode == 0, onboarded.site.stdout[-5000:]

    # pip had no index: only the bundle's verified wheelhouse, on every host
    bundle_wheels = f"/opt/letsinfer/bundles/{bundle.id}/wheelhouse"
    pip_runs = re.findall(
        r"- install\n\s+- --no-index\n\s+- --find-links\n\s+- (\S+)", onboarded.site.stdout
    )
    assert pip_runs == [bundle_wheels] * len(HOSTS)
    for host in HOSTS:
        listed = printed(onboarded.pip_lists[host])
        installed = {_dist(d["name"]): d["version"] for d in json.loads(listed)}
        for own in ("pip", "setuptools"):  # the virtual environment's own
            installed.pop(own, None)
        assert installed["letsinfer"] == "0.1.0"
        assert {d: bundle.wheels.get(d) for d in installed} == installed, host
        config = printed(onboarded.configs[host])
        assert f'trusted_keys = ["{bundle.public_key}"]' in config

    # the main's mirror holds the bundle, and its gateway serves the bundle's model
    mirrored = json.loads(printed(onboarded.mirrored))
    assert [(b["id"], b["models"][0]["name"]) for b in mirrored] == [(bundle.id, MODEL)]
    assert content(onboarded.answer) == SENTENCE


def test_a_second_run_of_bundle_and_site_changes_nothing(onboarded: Runs) -> None:
    assert onboarded.site.returncode == 0
    pid = json.loads(printed(onboarded.status_before_again))["pid"]

    again = onboarded.bundle_again
    assert again.returncode == 0, again.stdout
    assert changed(again) == dict.fromkeys(HOSTS, 0), again.stdout
    site = onboarded.site_again
    assert site.returncode == 0, site.stdout
    assert changed(site) == dict.fromkeys(HOSTS, 0), site.stdout

    status = json.loads(printed(onboarded.status_after_again))
    assert status["pid"] == pid


def test_upgrade_yml_moves_the_site_to_a_newer_bundle(
    lab: Lab, bundle: Bundle, onboarded: Runs, tmp_path: Path
) -> None:
    """The next release reaches the air-gapped site the same way: a signed
    bundle, verified here, installed from its wheelhouse only, one host at a time."""
    assert onboarded.site.returncode == 0
    newer = tmp_path / "site-0.1.1.tar"
    made = letsinfer(
        tmp_path / "connected",
        "bundle",
        "create",
        *("--out", str(newer), "--key", str(bundle.key)),
        *("--source", str(wheelhouse.variant_source(tmp_path, "0.1.1"))),
        timeout=600,
    )
    assert made.returncode == 0, made.stderr
    checked = letsinfer(
        tmp_path / "w", "bundle", "verify", str(newer), "--key", bundle.public_key, "--json"
    )
    assert checked.returncode == 0, checked.stderr
    newer_id = json.loads(checked.stdout)["bundle"]

    result = playbook(
        lab, "upgrade.yml", newer, bundle.public_key, "-e", "upgrade_version=0.1.1", "-v"
    )
    assert result.returncode == 0, result.stdout[-5000:]
    pip_runs = re.findall(
        r"- install\n\s+- --no-index\n\s+- --find-links\n\s+- (\S+)", result.stdout
    )
    assert pip_runs == [f"/opt/letsinfer/bundles/{newer_id}/wheelhouse"] * len(HOSTS)

    for host in HOSTS:
        version = sh(lab, host, "/opt/letsinfer/current/bin/letsinfer --version")
        assert version.split()[-1] == "0.1.1", host
        pip = sh(lab, host, "/opt/letsinfer/current/bin/python -m pip list --format json")
        assert {d["name"]: d["version"] for d in json.loads(pip)}["letsinfer"] == "0.1.1"
    listed = sh(lab, "main", "/opt/letsinfer/current/bin/letsinfer mirror list --bundles --json")
    assert {b["id"] for b in json.loads(listed)} == {bundle.id, newer_id}
    assert ask_the_gateway(lab) == SENTENCE, "the upgraded site still serves the bundled model"
