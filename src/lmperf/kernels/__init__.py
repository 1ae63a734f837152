"""Hand-written kernels. They know nothing of benchmarks or Snakemake."""
