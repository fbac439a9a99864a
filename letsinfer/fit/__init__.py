"""Will a model fit: its shape from GGUF metadata, and the memory an engine needs for it."""
