"""Models from a Hugging Face-compatible hub, or from the node's mirror when there is none."""
