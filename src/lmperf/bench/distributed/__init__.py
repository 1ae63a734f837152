"""Scaling across GPUs, the distributed section's bench side: the rank protocol (ranks.py), the
all-reduce study (allreduce.py), the data-parallel training step (ddp.py) and the command line
that runs one study under torchrun (__main__.py: python -m lmperf.bench.distributed <study>)."""
