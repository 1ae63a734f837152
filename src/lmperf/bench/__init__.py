"""Benchmark CLIs, one per report section (python -m lmperf.bench.<section>: a module, or the
distributed package), and what they share: the harness (common.py), the timers (timing.py), and
the ladder's choices by measured memory (memory_fit.py). The training step is lmperf.train."""
