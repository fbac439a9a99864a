"""Offline bundles: everything an air-gapped site needs, in one signed tar."""
