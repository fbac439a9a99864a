# Copyright: letsinfer contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Tests for templates: ``x is letsinfer.cluster.ip_address(4)``,
``x is letsinfer.cluster.ip_network(6)`` (no version: either family)."""

from __future__ import annotations

import ipaddress


def ip_address(value, version=None):
    try:
        found = ipaddress.ip_address(str(value).strip()).version
    except ValueError:
        return False
    return version is None or found == int(version)


def ip_network(value, version=None):
    try:
        found = ipaddress.ip_network(str(value).strip(), strict=False).version
    except ValueError:
        return False
    return version is None or found == int(version)


class TestModule:
    def tests(self):
        return {"ip_address": ip_address, "ip_network": ip_network}
