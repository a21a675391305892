"""Benchmarks of runstream: the workloads of BENCHMARKS.md (W1..W7) and the bare-Kafka
floor. Run ``python -m benchmarks --help``; figures go to ``benchmarks/results/``.

Nothing here runs in the test suite and nothing asserts a time.
"""
