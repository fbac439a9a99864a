"""Benchmarks: timing goals live here, never in tests (see docs/benchmarks.md)."""
