"""The checks that need letsinfer installed, and the plan of a node's checks
from its config: its ports, its clock reference, its engine runtime and its
certificates."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
from functools import partial
from typing import TYPE_CHECKING

from letsinfer import config
from letsinfer.config import Settings
from letsinfer.doctor.clock import HttpTimeSource, TimeSource, parse_ntp
from letsinfer.doctor.exposure import exposure_certificate
from letsinfer.doctor.findings import Finding, fail, ok, warn
from letsinfer.doctor.host import HostPlan
from letsinfer.doctor.ports import Port
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity

if TYPE_CHECKING:
    from cryptography.x509 import Certificate

# A child's agent renews its certificate 10 days before it expires.
RENEW_DAYS = 10


def load_settings(home: Home) -> tuple[Settings, list[Finding]]:
    """The node's settings, or the defaults and a failure naming what is wrong."""
    try:
        settings = config.load(home.config_file)
    except config.ConfigError as exc:
        first = str(exc).splitlines()
        return Settings(), [
            fail(
                "config",
                " ".join(line.strip() for line in first[:3]),
                f"correct {home.config_file} (or the LETSINFER_* variable it names)",
            )
        ]
    if not home.config_file.exists():
        return settings, [
            ok(
                "config",
                f"no {home.config_file}: the defaults apply (and any LETSINFER_* variables)",
            )
        ]
    return settings, [ok("config", f"{home.config_file} is valid")]


def ports_of(settings: Settings, main: bool) -> list[Port]:
    agent = settings.agent
    ports = [Port("agent plane", agent.api_host, agent.api_port, "[agent] api_port")]
    if main:
        gw, control = settings.gateway, settings.control
        ports = [
            Port("gateway", gw.host, gw.port, "[gateway] port"),
            Port("control plane", control.host, control.port, "[control] port"),
            *ports,
        ]
        if gw.metrics_port:
            where = "[gateway] metrics_port"
            ports.append(Port("metrics", gw.metrics_host, gw.metrics_port, where))
    return ports


def clock_sources(home: Home, identity: NodeIdentity | None, ntp: str | None) -> list[TimeSource]:
    """A child compares with its main (the control plane's open ``/v1/time``,
    the server checked against the cluster CA); anyone with ``ntp`` with it."""
    sources: list[TimeSource] = []
    if identity is not None and identity.role == "child" and identity.main_address:
        from letsinfer.trust.material import tls_files
        from letsinfer.trust.peer import client_context

        files = tls_files(home, identity)
        if files.ca is not None and files.ca.exists():
            sources.append(
                HttpTimeSource(
                    f"https://{identity.main_address}/v1/time",
                    client_context(files.ca),
                    label=f"the main at {identity.main_address}",
                )
            )
    if ntp:
        sources.append(parse_ntp(ntp))
    return sources


def engine_runtime(settings: Settings) -> list[Finding]:
    """The bundled engine imports (in a child process: a wheel built for
    another CPU may crash it), and a llama-server binary, when configured or
    on the PATH, runs ``--version``."""
    out = []
    probe = "import importlib.metadata as m, xllamacpp; print(m.version('xllamacpp'))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
        )
        loaded, said = done.returncode == 0, (done.stdout or done.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        loaded, said = False, str(exc)
    kind = settings.engine.kind
    if loaded:
        out.append(ok("engine xllamacpp", f"xllamacpp {said} loads"))
    else:
        last = said.splitlines()[-1] if said else "no output"
        level = fail if kind == "xllamacpp" else warn
        out.append(
            level(
                "engine xllamacpp",
                f"the bundled engine does not load: {last}",
                "reinstall letsinfer for this machine's Python and CPU",
            )
        )
    binary = settings.engine.llama_server_binary
    path = shutil.which(binary)
    if path is None:
        if kind == "llama-server":
            out.append(
                fail(
                    "engine llama-server",
                    f"{binary} not found ([engine] kind = llama-server)",
                    "install llama.cpp's server, or set [engine] llama_server_binary to its path",
                )
            )
        return out
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        text = (done.stdout + done.stderr).strip()
        ran = done.returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        text, ran = str(exc), False
    line = next((s for s in text.splitlines() if "version" in s.lower()), text[:120])
    if ran:
        out.append(ok("engine llama-server", f"{path}: {line}"))
    else:
        level = fail if kind == "llama-server" else warn
        out.append(
            level(
                "engine llama-server",
                f"{path} --version failed: {line or 'no output'}",
                "rebuild or reinstall llama.cpp's server for this machine",
            )
        )
    return out


def certificates(
    home: Home, identity: NodeIdentity | None, now: dt.datetime | None = None
) -> list[Finding]:
    """The node certificate (issued by the cluster CA, valid now, days left)
    and the CA certificate."""
    from letsinfer.trust import pki
    from letsinfer.trust.material import tls_files

    if identity is None:
        return [ok("certificate", "not a letsinfer node yet: no certificate to check")]
    if not identity.enrolled:
        return [ok("certificate", "a candidate: its cluster certificate comes with enrollment")]
    now = now or dt.datetime.now(dt.UTC)
    files = tls_files(home, identity)
    out = []
    try:
        cert = pki.load_cert(files.cert.read_bytes())
        ca = pki.load_cert(files.ca.read_bytes()) if files.ca else None
    except (OSError, pki.CertificateError) as exc:
        return [fail("certificate", f"cannot read {files.cert}: {exc}", "re-enroll this node")]
    if ca is not None:
        try:
            pki.verify_issued_by(cert, ca)
        except pki.CertificateError:
            out.append(
                fail(
                    "certificate",
                    f"{files.cert} was not issued by this cluster's CA",
                    "re-enroll this node (wipe it, node init, node add on the main)",
                )
            )
        out.append(validity("CA certificate", ca, now, renewable=False, main=False))
    out.append(validity("certificate", cert, now, renewable=True, main=identity.role == "main"))
    return out


def validity(
    check: str, cert: Certificate, now: dt.datetime, *, renewable: bool, main: bool
) -> Finding:
    not_before = cert.not_valid_before_utc
    not_after = cert.not_valid_after_utc
    left = (not_after - now).total_seconds()
    days = left / 86400
    when = not_after.strftime("%Y-%m-%d %H:%M UTC")
    if now < not_before:
        return fail(
            check,
            f"not valid before {not_before:%Y-%m-%d %H:%M} UTC: this clock is behind",
            "synchronise the clock",
        )
    if left <= 0:
        return fail(check, f"expired on {when}", expiry_fix(main, renewable))
    if renewable and days < RENEW_DAYS:
        return warn(
            check,
            f"expires on {when}, in {days:.1f} days",
            expiry_fix(main, renewable),
        )
    return ok(check, f"valid until {when} ({days:.0f} days)")


def expiry_fix(main: bool, renewable: bool) -> str:
    if not renewable:
        return "make a new cluster CA: re-create the main and re-enroll every node"
    if main:
        return "the main does not renew its own certificate yet: re-issue it from the cluster CA"
    return "a child renews with its next report to the main: make sure it reaches the main"


def plan_for(home: Home, identity: NodeIdentity | None, ntp: str | None) -> HostPlan:
    settings, config_findings = load_settings(home)
    main = identity is None or identity.role == "main"
    return HostPlan(
        home=home,
        main=main,
        ports=ports_of(settings, main),
        clock=clock_sources(home, identity, ntp),
        discovery=settings.discovery.enabled,
        fake_gpus=settings.hardware.fake_gpus,
        extra=[
            lambda: config_findings,
            partial(engine_runtime, settings),
            partial(certificates, home, identity),
            partial(exposure_certificate, home, identity),
        ],
    )
