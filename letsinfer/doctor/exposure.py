"""`doctor` on the main: the certificate `letsinfer exposure enable` publishes,
warned about before it expires (a renewed file is served without a restart)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from letsinfer.doctor.findings import Finding, fail, ok, warn
from letsinfer.home import Home
from letsinfer.identity import NodeIdentity

CHECK = "exposure certificate"


def exposure_certificate(
    home: Home, identity: NodeIdentity | None, now: dt.datetime | None = None
) -> list[Finding]:
    """Nothing when nothing is published (or on a child)."""
    from letsinfer.exposure import settings
    from letsinfer.exposure.certificate import (
        WARN_DAYS,
        CertificateRefused,
        check_pair,
        cluster_files,
    )

    if identity is None or identity.role != "main":
        return []
    try:
        published = settings.load(home)
    except settings.ExposureSettingsError as exc:
        return [fail("exposure", str(exc), "letsinfer exposure enable ... (or disable)")]
    if published is None:
        return []
    if published.cluster_ca:
        sans = " ".join(f"--san {s}" for s in published.sans)
        renew = f"letsinfer exposure enable --cluster-ca {sans} --port {published.port} again"
    elif Path(published.cert) == cluster_files(home)[0]:  # a controller sent the pair
        renew = (
            f"letsinfer exposure enable --cert RENEWED_CERT --key ITS_KEY --port {published.port} "
            "again, where the files are (a controller sends them; the main keeps its copy)"
        )
    else:
        renew = f"replace {published.cert} and {published.key} with a renewed pair"
    renew += " (served to the next connection, no restart)"
    now = now or dt.datetime.now(dt.UTC)
    try:
        served = check_pair(Path(published.cert), Path(published.key), now=now)
    except CertificateRefused as exc:
        return [fail(CHECK, f"the published certificate cannot be served: {exc}", renew)]
    days = (served.not_after - now).total_seconds() / 86400
    when = f"{served.not_after:%Y-%m-%d %H:%M} UTC"
    if days < WARN_DAYS:
        return [warn(CHECK, f"{served.subject} expires on {when}, in {days:.1f} days", renew)]
    return [ok(CHECK, f"{served.subject} valid until {when} ({days:.0f} days)")]
