"""`letsinfer exposure` behind the firewall role's own rules, on lab hosts
(network namespaces): a listed client reaches the TLS port and nothing else
of the main's planes; an outsider (in no letsinfer group, not listed)
reaches nothing on it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from letsinfer.exposure.certificate import issue_from_cluster_ca
from tests.cluster import PY, Cluster
from tests.firewall import render
from tests.netlab import NetLab, can_make_namespaces

pytestmark = pytest.mark.skipif(not can_make_namespaces(), reason="needs root (namespaces)")

TLS_PORT = 443
METRICS_PORT = 9400

# Which of the main's ports a TCP connection from this host reaches.
REACH = """
import json, socket, sys
reached = {}
for port in sys.argv[2:]:
    try:
        socket.create_connection((sys.argv[1], int(port)), timeout=1.5).close()
        reached[port] = True
    except OSError:
        reached[port] = False
print(json.dumps(reached))
"""

# The openai client with the CA file the command printed, over TLS.
ASK = """
import httpx, openai, ssl, sys
tls = ssl.create_default_context(cafile=sys.argv[3])
client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0,
                       http_client=httpx.Client(verify=tls, timeout=30))
print(client.chat.completions.create(
    model="tiny", messages=[{"role": "user", "content": "hi"}]).choices[0].message.content)
"""

# The SANs of the certificate a new TLS connection is shown.
SANS = """
import socket, ssl, sys
from cryptography import x509
ctx = ssl.create_default_context(cafile=sys.argv[3])
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as raw:
    with ctx.wrap_socket(raw, server_hostname=sys.argv[1]) as tls:
        cert = x509.load_der_x509_certificate(tls.getpeercert(True))
names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
print(" ".join(names.get_values_for_type(x509.DNSName)), cert.serial_number)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("exposure-lab")
    lab = NetLab(["main", "client", "outsider"]).up()
    c = Cluster(lab, root)
    main = lab.hosts["main"]
    c.extra_env = {
        "main": {
            "LETSINFER_GATEWAY__METRICS_HOST": main,
            "LETSINFER_GATEWAY__METRICS_PORT": str(METRICS_PORT),
            "LETSINFER_GATEWAY__METRICS_ALLOW": f"{lab.hosts['client']}/32",
        }
    }
    try:
        out = c.ok("main", "node", "init", "--main", "--name", "main")
        c.key = out.split("API key (shown once): ")[1].split()[0]
        c.up("main")
        yield c
    finally:
        c.stop()
        lab.down()


def reach(c: Cluster, host: str, *ports: int) -> dict[int, bool]:
    result = c.lab.run(host, PY, "-c", REACH, c.lab.hosts["main"], *map(str, ports))
    assert result.returncode == 0, result.stderr
    return {int(p): ok for p, ok in json.loads(result.stdout).items()}


def test_exposure_publishes_only_the_tls_port_to_the_listed_host(
    cluster: Cluster, tmp_path: Path
) -> None:
    c = cluster
    main, client = c.lab.hosts["main"], c.lab.hosts["client"]
    subnet = main.rsplit(".", 1)[0] + ".0/24"
    rules = tmp_path / "letsinfer.nft"  # the firewall role's table, with the exposure's port
    rules.write_text(render([main], [main], [subnet], TLS_PORT, [f"{client}/32"]))
    loaded = c.lab.run("main", "nft", "-f", str(rules))
    assert loaded.returncode == 0, loaded.stderr
    try:
        out = c.ok(
            "main", "exposure", "enable", "--cluster-ca", "--san", main,
            "--from", f"{client}/32",
        )  # fmt: skip
        ca = out.split("clients trust the cluster CA: ")[1].split()[0]
        assert Path(ca).is_file()

        # The listed host: the TLS port, and none of control, agent or metrics.
        assert reach(c, "client", TLS_PORT, 8443, 8444, METRICS_PORT) == {
            TLS_PORT: True,
            8443: False,
            8444: False,
            METRICS_PORT: False,
        }
        # The outsider: nothing on the TLS port (nor on the other planes).
        assert reach(c, "outsider", TLS_PORT, 8443, 8444, METRICS_PORT) == {
            TLS_PORT: False,
            8443: False,
            8444: False,
            METRICS_PORT: False,
        }

        url = f"https://{main}:{TLS_PORT}/v1"
        assert c.key is not None
        asked = c.lab.run("client", PY, "-c", ASK, url, c.key, ca, env=c.env("client"))
        assert asked.returncode == 0, asked.stderr
        assert asked.stdout.strip()

        # A certificate replaced on disk (new SAN, new serial): the next connection.
        seen = c.lab.run("client", PY, "-c", SANS, main, str(TLS_PORT), ca)
        assert seen.returncode == 0, seen.stderr
        status = json.loads(c.ok("main", "exposure", "status", "--json"))
        etc = c.home("main") / "etc"
        issue_from_cluster_ca(
            etc / "ca" / "ca.key",
            Path(ca),
            (main, "renewed.example"),
            Path(status["certificate_file"]),
            Path(status["key_file"]),
        )
        renewed = c.lab.run("client", PY, "-c", SANS, main, str(TLS_PORT), ca)
        assert renewed.returncode == 0, renewed.stderr
        assert "renewed.example" in renewed.stdout
        assert renewed.stdout.split()[-1] != seen.stdout.split()[-1]  # another serial
        assert c.procs["main"].poll() is None  # no restart

        # disable closes it.
        c.ok("main", "exposure", "disable")
        assert reach(c, "client", TLS_PORT) == {TLS_PORT: False}
    finally:
        c.lab.run("main", "nft", "delete", "table", "inet", "letsinfer")
        c.cli("main", "exposure", "disable")


def test_plain_off_leaves_only_tls_from_the_next_start(cluster: Cluster) -> None:
    c = cluster
    main = c.lab.hosts["main"]
    assert reach(c, "client", 8000) == {8000: True}  # the LAN's plain listener, as configured
    try:
        out = c.ok(
            "main", "exposure", "enable", "--cluster-ca", "--san", main, "--plain", "off",
        )  # fmt: skip
        assert "takes effect at the next start" in out
        c.stop()
        c.up("main")
        assert reach(c, "client", 8000, TLS_PORT) == {8000: False, TLS_PORT: True}
        ca = json.loads(c.ok("main", "exposure", "status", "--json"))["ca_file"]
        health = c.lab.run(
            "client", PY, "-c",
            "import httpx, ssl, sys; print(httpx.get(sys.argv[1], verify="
            "ssl.create_default_context(cafile=sys.argv[2])).status_code)",
            f"https://{main}:{TLS_PORT}/health", ca,
        )  # fmt: skip
        assert health.stdout.strip() == "200", health.stderr
    finally:
        c.ok("main", "exposure", "disable")
        c.stop()
        c.up("main")
    assert reach(c, "client", 8000, TLS_PORT) == {8000: True, TLS_PORT: False}
