"""letsinfer: a few machines with GPUs (or none) as one private OpenAI-compatible service."""

__version__ = "0.1.0"
