#!/usr/bin/python
# Copyright: letsinfer contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module letsinfer_enrollment: enroll a child node with the main."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: letsinfer_enrollment
short_description: Enroll a candidate node with the main (request on the main, accept on the child)
version_added: "1.0.0"
description:
  - Drives letsinfer's enrollment commands. O(state=requested) runs on the main
    and sends a certificate-pinned enrollment request to the candidate
    (C(letsinfer node add --address HOST:PORT --fingerprint SHA256)).
    O(state=accepted) runs on the candidate and accepts the pending request
    O(request_id) (the id the main's request step returned) when its cluster CA
    fingerprint is O(ca_fingerprint)
    (C(letsinfer node accept ID --ca-fingerprint SHA256)).
  - Enrollment is bound to the main's identity, never to names or addresses. A
    request names its main, address and expiry in words the requester chose,
    and the CA certificate it carries is public, so any host on the LAN can
    send one naming the real main and its CA. The candidate keeps only requests
    signed by the key of a main of the CA they carry (others are refused as
    they arrive), and this module takes the exact request O(request_id), so no
    other request costs it its place. With O(state=accepted), every other
    pending request on the candidate is rejected (C(letsinfer node reject ID),
    audited on the candidate). Read O(ca_fingerprint) from the inventory's main
    itself (C(ca_fingerprint) in its C(letsinfer status --json)), never from
    the candidate.
  - A node that already belongs to a cluster is left as it is when that is the
    cluster of O(ca_fingerprint); one of another cluster fails, since moving it
    is an explicit adoption, never done here.
  - The commands arrive with letsinfer's trust layer; with a letsinfer that
    lacks them the module fails and says so. The C(main) role calls it only
    when C(main_enroll_children) is true.
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  state:
    description: V(requested) on the main, V(accepted) on the candidate.
    type: str
    choices: [requested, accepted]
    required: true
  address:
    description:
      - With O(state=requested), the candidate's agent address C(HOST:PORT) (required).
      - Not used with O(state=accepted), since an address proves nothing.
    type: str
  fingerprint:
    description:
      - With O(state=requested), the candidate's certificate fingerprint (its
        C(letsinfer status)); the request is pinned to it (C(--fingerprint)).
    type: str
  ca_fingerprint:
    description:
      - With O(state=accepted) (required), the SHA-256 fingerprint of the main's
        cluster CA certificate, as the main reports it (C(ca_fingerprint) in
        C(letsinfer status --json)); C(sha256:) and colons are allowed.
      - Only a request from that cluster is accepted; every other pending one is rejected.
      - Empty in check mode when the main does not exist yet (this run would create it).
    type: str
  request_id:
    description:
      - With O(state=accepted), the id of the request the main sent (C(id) in
        the O(state=requested) result, C(request.id)); only that request is
        accepted.
      - Without it (the module run on its own), the newest pending request of
        the cluster of O(ca_fingerprint) is taken; every request a candidate
        keeps is signed by its main, so its expiry is the main's own.
    type: str
  executable:
    description: Path of the C(letsinfer) command on the host.
    type: path
    default: /opt/letsinfer/current/bin/letsinfer
  home:
    description: The node's home (C(--home)); empty for the default.
    type: path
author:
  - letsinfer contributors
"""

EXAMPLES = r"""
- name: Enroll | Read the main's cluster CA fingerprint
  letsinfer.cluster.letsinfer_node:
    state: info
  delegate_to: "{{ groups['letsinfer_main'][0] }}"
  register: main_node

- name: Enroll | Ask the main to enroll this child, pinned to its certificate
  letsinfer.cluster.letsinfer_enrollment:
    state: requested
    address: "{{ hostvars[item].ansible_host }}:8444"
    fingerprint: "{{ child_status.node.fingerprint }}"
  delegate_to: "{{ groups['letsinfer_main'][0] }}"
  register: sent

- name: Enroll | Accept exactly that request on the child, bound to the main's CA
  letsinfer.cluster.letsinfer_enrollment:
    state: accepted
    ca_fingerprint: "{{ main_node.node.ca_fingerprint }}"
    request_id: "{{ sent.request.id | default(omit) }}"
"""

RETURN = r"""
request:
  description: The enrollment request that was sent or accepted.
  returned: changed
  type: dict
rejected:
  description:
    - With O(state=accepted), the pending requests from any other cluster (or
      older ones from the same main) that were rejected, or would be in check mode.
  returned: when O(state=accepted) and the node was a candidate
  type: list
  elements: dict
role:
  description: This node's role after the call (C(main) or C(child)).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.letsinfer.cluster.plugins.module_utils.letsinfer_cli import (  # noqa: E402
    CliError,
    LetsinferCli,
)


class EnrollmentError(Exception):
    pass


def _host(address):
    """The host part of HOST:PORT, [V6]:PORT or a bare host."""
    address = str(address or "").strip()
    if address.startswith("["):
        return address[1:].split("]", 1)[0]
    return address.rsplit(":", 1)[0] if address.count(":") == 1 else address


def _normalized(fingerprint):
    """A SHA-256 fingerprint as 64 lowercase hex digits, or None."""
    value = str(fingerprint or "").strip().lower()
    value = value[len("sha256:") :] if value.startswith("sha256:") else value
    value = value.replace(":", "")
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        return None
    return value


def _mentions(record, host):
    """Whether an address field of ``record`` (a row of the main's own node
    list) names ``host`` (exactly, not as a prefix)."""
    return bool(host) and any(_host(v) == host for k, v in record.items() if "address" in k)


class Enrollment:
    def __init__(self, cli, check_mode=False):
        self.cli = cli
        self.check_mode = check_mode

    def _require(self):
        if not self.cli.installed():
            raise EnrollmentError(f"letsinfer is not installed at {self.cli.executable}")
        try:
            self.cli.run("node", "--help")
        except CliError as exc:
            raise EnrollmentError(
                "this letsinfer has no `node` commands: enrollment needs a release "
                "with the trust layer"
            ) from exc

    def _predicted(self, role):
        """In check mode, a node this run has yet to install or initialise would be
        enrolled by it: report the change instead of failing."""
        if not self.check_mode:
            return None
        if not self.cli.installed():
            return {"changed": True, "role": role}
        if not self.cli.status().get("initialised"):
            return {"changed": True, "role": role}
        return None

    def request(self, address, fingerprint=None):
        """On the main: request enrollment of the candidate at ``address``."""
        predicted = self._predicted("main")
        if predicted:
            return predicted
        self._require()
        status = self.cli.status()
        if status.get("role") != "main":
            raise EnrollmentError("`state: requested` runs on the main node")
        nodes = self.cli.json("node", "list", "--json")
        host = _host(address)
        known = [n for n in nodes if _mentions(n, host)]
        if known:
            return {"changed": False, "role": "main", "node": known[0]}
        request = {"address": address}
        if not self.check_mode:
            args = ["node", "add", "--address", address, "--json"]
            if fingerprint:
                args += ["--fingerprint", fingerprint]
            request = self.cli.json(*args)
        return {"changed": True, "role": "main", "request": request}

    def accept(self, ca_fingerprint, request_id=None):
        """On the candidate: accept the pending request ``request_id`` (or, without
        one, the newest) from the cluster whose CA fingerprint is
        ``ca_fingerprint``; reject every other pending request."""
        predicted = self._predicted("child")
        if predicted:
            return predicted
        wanted = _normalized(ca_fingerprint)
        if wanted is None and not self.check_mode:
            raise EnrollmentError(
                f"ca_fingerprint {ca_fingerprint!r} is not a SHA-256 fingerprint; read it "
                "from the main (`ca_fingerprint` in its `letsinfer status --json`)"
            )
        self._require()
        status = self.cli.status()
        if status.get("role") == "main":
            raise EnrollmentError(
                "this host is a main node; it cannot be enrolled as a child "
                "(wipe it first, or make it the main in the inventory)"
            )
        if status.get("role") == "child":
            theirs = _normalized(status.get("ca_fingerprint"))
            if wanted is not None and theirs != wanted:
                raise EnrollmentError(
                    f"this node already belongs to another cluster (CA sha256:{theirs}, main "
                    f"at {status.get('main')}), not the one of sha256:{wanted}; moving it is an "
                    "explicit adoption (`letsinfer node move-into`), not done by this module"
                )
            return {"changed": False, "role": "child"}
        # The candidate lists only requests signed by a main of the CA they
        # carry, so a LAN host holding the (public) CA cannot list one here.
        pending = self.cli.json("node", "requests", "--json")
        ours = [r for r in pending if wanted and _normalized(r.get("ca_fingerprint")) == wanted]
        if request_id:
            # Exactly the request the main just sent: nothing else can take its place.
            chosen = next((r for r in ours if str(r.get("id")) == str(request_id)), None)
        else:
            # A main that sent again (an earlier run stopped before accepting)
            # left several; the newest, by the expiry its main signed, is the
            # one it waits for.
            chosen = max(ours, key=lambda r: str(r.get("expires") or "")) if ours else None
        rejected = [r for r in pending if r is not chosen]
        if not self.check_mode:
            for r in rejected:
                self.cli.run("node", "reject", str(r["id"]))
        if chosen is None and not self.check_mode:
            raise EnrollmentError(
                "no pending enrollment request "
                + (f"{request_id} " if request_id else "")
                + f"from the cluster of CA sha256:{wanted}"
                + (f" (rejected {len(rejected)} other pending)" if rejected else "")
            )
        # In check mode without a request from the main yet: this run's own
        # (skipped) request step would send it.
        result = {"changed": True, "role": "child", "rejected": rejected}
        if chosen is not None:
            result["request"] = chosen
            if not self.check_mode:
                self.cli.run("node", "accept", str(chosen["id"]), "--ca-fingerprint", wanted)
        return result


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["requested", "accepted"]},
            "address": {"type": "str"},
            "fingerprint": {"type": "str"},
            "ca_fingerprint": {"type": "str"},
            "request_id": {"type": "str"},
            "executable": {"type": "path", "default": "/opt/letsinfer/current/bin/letsinfer"},
            "home": {"type": "path"},
        },
        required_if=[
            ("state", "requested", ["address"]),
            ("state", "accepted", ["ca_fingerprint"]),
        ],
        supports_check_mode=True,
    )
    p = module.params
    cli = LetsinferCli(
        lambda argv: module.run_command(argv), executable=p["executable"], home=p["home"]
    )
    enrollment = Enrollment(cli, module.check_mode)
    try:
        if p["state"] == "requested":
            result = enrollment.request(p["address"], p["fingerprint"])
        else:
            result = enrollment.accept(p["ca_fingerprint"], p["request_id"])
    except EnrollmentError as exc:
        module.fail_json(msg=str(exc))
    except CliError as exc:
        module.fail_json(msg=str(exc), rc=exc.rc, stdout=exc.stdout, stderr=exc.stderr)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
