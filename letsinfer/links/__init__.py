"""Data links between nodes: signed challenges on the data address, and a
direct-route check, proven by both ends before a parallel group uses them."""
