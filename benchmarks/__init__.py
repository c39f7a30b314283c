"""Latency benchmarks writing BENCHMARKS.md."""
