"""Render report/report.md from the results CSVs (python -m lmperf.report)."""
