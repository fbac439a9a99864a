"""Whether this node's nftables table (``inet letsinfer``, loaded by the
firewall role) is in the kernel: reported in the signed facts, so that
``doctor --cluster`` can tell that every member is firewalled. Standard
library only (``letsinfer doctor`` uses it before install too).
"""

from __future__ import annotations

import shutil
import subprocess
import time

TABLE = "letsinfer"


def table_loaded(table: str = TABLE) -> bool | None:
    """True: loaded; False: not loaded; None: cannot tell (no nft, no privilege)."""
    # sbin is not on every user's PATH
    nft = shutil.which("nft") or shutil.which("nft", path="/usr/sbin:/sbin")
    if nft is None:
        return None
    try:
        done = subprocess.run(
            [nft, "list", "table", "inet", table],
            capture_output=True,
            text=True,
            timeout=10,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode == 0:
        return True
    if "No such file or directory" in done.stderr:
        return False
    return None  # "Operation not permitted" and the like


class FirewallProbe:
    """``table_loaded`` at most once per ``ttl_s``: facts go out every few
    seconds, and a subprocess per report is more than this needs."""

    def __init__(self, ttl_s: float = 10.0, table: str = TABLE) -> None:
        self.ttl_s = ttl_s
        self.table = table
        self._at = -float("inf")
        self._value: bool | None = None

    def loaded(self) -> bool | None:
        now = time.monotonic()
        if now - self._at >= self.ttl_s:
            self._value = table_loaded(self.table)
            self._at = now
        return self._value
