# Copyright: letsinfer contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""``identity_problem``: whether the letsinfer node already on a host is the
one the inventory says it is, so a role never adopts a stray node silently.

    found | letsinfer.cluster.identity_problem(role, host, main_found, pinned)

``found`` and ``main_found`` are the ``node.json`` of this host and of the
inventory's main host (a dict, or empty when there is none); ``role`` is
``main`` or ``child`` as the inventory says; ``pinned`` an expected cluster CA
fingerprint (empty: none). The result is empty when the node fits, else one
sentence saying what was found instead.
"""

from __future__ import annotations


def _fp(value):
    text = str(value or "").strip().lower()
    return (text[len("sha256:") :] if text.startswith("sha256:") else text).replace(":", "")


def _what(node):
    name, role, cluster = node.get("name"), node.get("role"), node.get("cluster")
    text = f"a letsinfer {role} named {name!r} (node id {node.get('node_id')}"
    if cluster:
        text += f", cluster CA sha256:{cluster}"
    if role == "child" and node.get("main_address"):
        text += f", main at {node.get('main_address')}"
    return text + ")"


def identity_problem(found, role, host, main_found=None, pinned=""):
    found = found or {}
    main_found = main_found or {}
    pinned = _fp(pinned)
    if not found:
        return ""
    here = f"{host} already holds {_what(found)}"
    if role == "main":
        if found.get("role") != "main":
            return f"{here}, but the inventory makes {host} the main"
        if pinned and _fp(found.get("cluster")) != pinned:
            return f"{here}, not the main of the inventory's cluster (CA sha256:{pinned})"
        if not pinned and found.get("name") != host:
            return (
                f"{here}, which this inventory did not make (it names its main {host!r}); "
                "if it is this site's main, pin its cluster with node_cluster_fingerprint"
            )
        return ""
    if found.get("role") == "main":
        return f"{here}, but the inventory makes {host} a child"
    if found.get("role") != "child":
        return ""  # a candidate: the main role enrolls it, bound to the main's CA
    main_cluster = _fp(main_found.get("cluster")) if main_found.get("role") == "main" else ""
    expected = pinned or main_cluster
    if not expected:
        return f"{here}: a child of another cluster, since the inventory's main has no node yet"
    if _fp(found.get("cluster")) != expected:
        return f"{here}: a child of another cluster than the inventory's (CA sha256:{expected})"
    return ""


class FilterModule:
    def filters(self):
        return {"identity_problem": identity_problem}
