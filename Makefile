# The two commands of the README: `make report` and `make test`. Both set up .venv first.
VENV ?= .venv
CORES ?= 1
SNAKEMAKE_ARGS ?=
# The kernel tests run a second time under the newest Triton, in a venv of its own.
NEWEST_VENV ?= .venv-triton-newest
# pytest-xdist: one worker process per core; tests sharing a fixture wider than one test run on
# one worker (tests/conftest.py). PYTEST_WORKERS=0 runs the suite in this process.
PYTEST_WORKERS ?= auto
PYTEST_XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup)
KERNEL_TESTS ?= tests/test_lrpe.py tests/test_flash_attention.py tests/test_flash_attention_gqa.py tests/test_adamw_master.py tests/test_fused.py \
	tests/test_float8_delayed.py tests/test_float8_delayed_check.py tests/test_kernel_writes.py
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup report test test-triton-newest clean-results

setup:
	envs/setup.sh $(VENV)

report: setup
	snakemake --cores $(CORES) report/report.md $(SNAKEMAKE_ARGS)

# The whole suite with the pinned torch and triton, then the kernel tests with the newest triton.
test: setup
	python -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-triton-newest

# The kernel tests under the newest Triton's interpreter (envs/requirements-triton-newest.txt:
# the same CPU torch, the newest triton), whatever the machine.
test-triton-newest:
	envs/setup.sh $(NEWEST_VENV) envs/requirements-triton-newest.txt
	$(NEWEST_VENV)/bin/python -m pytest $(PYTEST_XDIST) $(KERNEL_TESTS) $(PYTEST_ARGS)

# Remove this machine's results (keeps other machines' committed results).
clean-results:
	snakemake --cores 1 --delete-all-output
