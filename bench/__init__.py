"""Benchmarks of dtrain against the launchers people would otherwise use (see docs/benchmarks.md).

Run as `python -m bench` (root: it brings up the namespaced sshd test cluster itself).
"""
