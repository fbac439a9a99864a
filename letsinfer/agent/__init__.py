"""The agent: runs on every node, keeps its engines in the state the authority wants."""
