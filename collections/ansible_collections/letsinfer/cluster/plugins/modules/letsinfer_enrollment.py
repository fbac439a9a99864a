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
    (C(letsinfer node add --address HOST:PORT)). O(state=accepted) runs on the
    candidate and accepts the pending request that came from the main
    (C(letsinfer node requests --json), then C(letsinfer node accept ID)).
  - A node that already belongs to a cluster is left as it is; moving it is an
    explicit adoption, never done here.
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
      - With O(state=requested), the candidate's agent address C(HOST:PORT).
      - With O(state=accepted), the main's address; only a request from it is accepted.
    type: str
    required: true
  fingerprint:
    description:
      - With O(state=requested), the candidate's certificate fingerprint (its
        C(letsinfer status)); the request is pinned to it (C(--fingerprint)).
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
- name: Enroll | Ask the main to enroll this child
  letsinfer.cluster.letsinfer_enrollment:
    state: requested
    address: "{{ hostvars[item].ansible_host }}:8444"
  delegate_to: "{{ groups['letsinfer_main'][0] }}"

- name: Enroll | Accept the main's request on the child
  letsinfer.cluster.letsinfer_enrollment:
    state: accepted
    address: "{{ hostvars[groups['letsinfer_main'][0]].ansible_host }}"
"""

RETURN = r"""
request:
  description: The enrollment request that was sent or accepted.
  returned: changed
  type: dict
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


def _mentions(record, host):
    """Whether an address field of ``record`` names ``host`` (exactly, not as a prefix)."""
    return bool(host) and any(
        _host(v) == host for k, v in record.items() if "address" in k or k == "main"
    )


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

    def accept(self, main_address):
        """On the candidate: accept the pending request that came from ``main_address``."""
        predicted = self._predicted("child")
        if predicted:
            return predicted
        self._require()
        status = self.cli.status()
        if status.get("role") == "child":
            where = str(status.get("main") or "")
            if _host(main_address) not in where:
                raise EnrollmentError(
                    f"this node already belongs to the main at {where}; moving it is an "
                    "explicit adoption, not done by this module"
                )
            return {"changed": False, "role": "child"}
        pending = [
            r
            for r in self.cli.json("node", "requests", "--json")
            if _mentions(r, _host(main_address))
        ]
        if not pending and self.check_mode:
            # The main's request is sent by this run's own (skipped) request step.
            return {"changed": True, "role": "child"}
        if not pending:
            raise EnrollmentError(f"no pending enrollment request from {main_address}")
        # A main that sent again (an earlier run stopped before accepting) left
        # several; the newest is the one it waits for.
        request = max(pending, key=lambda r: str(r.get("expires") or ""))
        if not self.check_mode:
            self.cli.run("node", "accept", str(request["id"]))
        return {"changed": True, "role": "child", "request": request}


def main():
    module = AnsibleModule(
        argument_spec={
            "state": {"type": "str", "required": True, "choices": ["requested", "accepted"]},
            "address": {"type": "str", "required": True},
            "fingerprint": {"type": "str"},
            "executable": {"type": "path", "default": "/opt/letsinfer/current/bin/letsinfer"},
            "home": {"type": "path"},
        },
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
            result = enrollment.accept(p["address"])
    except EnrollmentError as exc:
        module.fail_json(msg=str(exc))
    except CliError as exc:
        module.fail_json(msg=str(exc), rc=exc.rc, stdout=exc.stdout, stderr=exc.stderr)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
