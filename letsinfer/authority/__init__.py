"""The main node's authority: what the cluster should be, and who may change it."""
