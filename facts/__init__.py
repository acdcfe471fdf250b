"""Operator facts: the one place every other package reads the MLA prefill contract from.

A leaf: it imports nothing of this project, so golden, harness, judge, runner and reports may all
depend on it (docs/operator.md says where each fact comes from).
"""
