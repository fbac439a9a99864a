"""Standard Webhooks signatures: the secret an operator gives (``whsec_`` +
base64), and the three headers each attempt carries — ``webhook-id`` (the
same at every retry), ``webhook-timestamp`` (this attempt's) and
``webhook-signature`` (``v1,`` + base64 HMAC-SHA256 over ``id.timestamp.body``),
made by the ``standardwebhooks`` library receivers verify with."""

from __future__ import annotations

import base64
import binascii
import stat
from datetime import UTC, datetime
from pathlib import Path

from standardwebhooks import Webhook

PREFIX = "whsec_"
# Standard Webhooks: secrets of 24 to 64 random bytes.
MIN_BYTES, MAX_BYTES = 24, 64


class BadSecret(ValueError):
    pass


def check_secret(text: str) -> str:
    """The secret, stripped; refused unless ``whsec_`` + base64 of 24-64 bytes."""
    secret = text.strip()
    if not secret.startswith(PREFIX):
        raise BadSecret(f"a webhook secret starts with {PREFIX!r} (then base64)")
    try:
        raw = base64.b64decode(secret[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadSecret(f"what follows {PREFIX!r} is not base64 ({exc})") from None
    if not MIN_BYTES <= len(raw) <= MAX_BYTES:
        raise BadSecret(
            f"the secret holds {len(raw)} bytes; Standard Webhooks wants "
            f"{MIN_BYTES} to {MAX_BYTES} random bytes "
            f"(e.g. `echo {PREFIX}$(head -c 32 /dev/urandom | base64)`)"
        )
    return secret


def read_secret(path: Path) -> str:
    """The secret in ``path`` (its only content), checked; a file every user
    of this machine can read is refused (that secret is no secret)."""
    try:
        if path.stat().st_mode & stat.S_IROTH:
            raise BadSecret(
                f"the secret file {path} can be read by every user of this machine; "
                f"make a new secret in a private file (chmod 600 {path}, or 640 with the "
                "letsinfer group)"
            )
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadSecret(f"cannot read the secret file {path}: {exc}") from None
    try:
        return check_secret(text)
    except BadSecret as exc:
        raise BadSecret(f"{path}: {exc}") from None


def headers(
    secret: str, delivery_id: str, body: str, now: datetime | None = None
) -> dict[str, str]:
    """The headers of one attempt at delivering ``body``."""
    at = now or datetime.now(UTC)
    signature = Webhook(secret).sign(delivery_id, at, body.encode())
    return {
        "content-type": "application/json",
        "webhook-id": delivery_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }
