"""Benchmark CLIs, one module per report section (python -m lmperf.bench.<section>)."""
