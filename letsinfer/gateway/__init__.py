"""The gateway: the OpenAI-compatible endpoint clients see (``:8000/v1``)."""
