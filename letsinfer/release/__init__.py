"""Release signing: ed25519 keys, detached signatures, and the node's trust in them."""
