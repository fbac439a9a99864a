#!/usr/bin/python
# Copyright: letsinfer contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Documentation of the action plugin letsinfer.cluster.warning (plugins/action)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: warning
short_description: Print a message as an Ansible warning, without failing
version_added: "1.0.0"
description:
  - Runs on the controller (an action plugin) and prints O(msg) as
    C([WARNING]) in the play's output; nothing changes on any host.
  - Used where a play goes on without a protection because the operator opted
    out of it (C(firewall_enabled=false)).
extends_documentation_fragment:
  - action_common_attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: all
options:
  msg:
    description: What to say.
    type: str
    required: true
author:
  - letsinfer contributors
"""

EXAMPLES = r"""
- name: Firewall | Say that the firewall is off
  letsinfer.cluster.warning:
    msg: "firewall_enabled is false: every letsinfer port is open to the LAN"
  when: not firewall_enabled | bool
"""

RETURN = r"""
msg:
  description: The message.
  returned: always
  type: str
"""
