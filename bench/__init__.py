"""Benchmarks: one script per product or method benchmark, run as ``python -m bench.<name>``; their shared
pieces live in ``bench.harness``, one-round probes in ``bench.archive``. Nothing outside bench/ imports it."""
