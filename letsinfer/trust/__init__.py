"""Trust: the cluster CA, node and controller certificates, pinned enrollment, peers."""
