"""Eval suites (`letsinfer eval`): cases of messages and scorers, run through
the main's gateway, weighed into one score against a threshold (docs/evals.md).
"""
