"""A lab of hosts made of Linux namespaces, reached over real SSH (see tests/lab/netns.py)."""

from tests.lab.netns import Lab, LabHost, lab_up

__all__ = ["Lab", "LabHost", "lab_up"]
