# Copyright: letsinfer contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Filters that check inventory values without extra Python packages.

``address_kind``: ``ipv4``, ``ipv6``, ``hostname`` or ``invalid`` for a host address.
``network_kind``: ``ipv4``, ``ipv6`` or ``invalid`` for a CIDR range such as 10.0.0.0/8.
"""

from __future__ import annotations

import ipaddress
import re

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def address_kind(value):
    text = str(value).strip()
    try:
        return f"ipv{ipaddress.ip_address(text).version}"
    except ValueError:
        pass
    if not text or len(text) > 253 or re.fullmatch(r"[0-9.]+", text):
        return "invalid"  # empty, too long, or a dotted number that is not an address
    labels = text.rstrip(".").split(".")
    return "hostname" if all(_LABEL.match(label) for label in labels) else "invalid"


def network_kind(value):
    try:
        return f"ipv{ipaddress.ip_network(str(value).strip(), strict=False).version}"
    except ValueError:
        return "invalid"


class FilterModule:
    def filters(self):
        return {"address_kind": address_kind, "network_kind": network_kind}
