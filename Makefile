# The two commands of the README: `make report` and `make test`. Both set up .venv first.
# `make report-deep` also measures the deep target (config `depth`), `make report-quick` the
# summary's cases alone on a GPU (report/quick/report.md); CONFIG="key=value ..." adds --config
# values to either (a --config in SNAKEMAKE_ARGS would be replaced by theirs), and
# CONTENDERS=path/to/their-repo (several joined by commas) runs a student's code beside ours
# (docs/contenders.md).
# `make test-slow` runs the rest of the suite (CI runs both; docs/testing.md says what each covers).
VENV ?= .venv
CORES ?= all
SNAKEMAKE_ARGS ?=
CONFIG ?=
CONTENDERS ?=
override CONFIG += $(if $(CONTENDERS),contenders=$(CONTENDERS))
# Snakemake's output less a failed job's command line (its whole spec), each failed job's log
# tail at the end (src/lmperf/runner.py)
RUN = python -m lmperf.runner
# The kernel tests run a second time under the newest Triton, in a venv of its own (make test-slow).
NEWEST_VENV ?= .venv-triton-newest
# pytest-xdist: one worker process per core; tests sharing a fixture wider than one test run on
# one worker (tests/conftest.py). PYTEST_WORKERS=0 runs the suite in this process.
PYTEST_WORKERS ?= auto
PYTEST_XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup)
KERNEL_TESTS ?= tests/test_lrpe.py tests/test_flash_attention.py tests/test_flash_attention_gqa.py tests/test_adamw_master.py tests/test_fused.py \
	tests/test_float8_delayed.py tests/test_float8_delayed_check.py tests/test_kernel_writes.py \
	tests/test_flash_attention_gluon.py tests/test_flash_attention_gluon_bwd.py tests/test_flash_attention_gluon_fused.py
# pytest exits 5 when a pass selects no test: a PYTEST_ARGS filter (-k, a file) that none of the
# pass's tests matches. EMPTY_OK=1 says so and goes on to the next pass; CI sets EMPTY_OK=0, for
# which a pass without tests is a failure.
EMPTY_OK ?= 1
export PATH := $(abspath $(VENV))/bin:$(PATH)

# $(call pytest,<python>,<selection>): one pass of the suite, pytest's exit status passed on.
# -rfEs: the summary names the failed tests, the errors and why tests were skipped (one line per
# reason and place); -r replaces pytest's default (fE), so f and E stay named.
define pytest
	$(1) -m pytest $(PYTEST_XDIST) -rfEs $(2) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ] && [ "$(EMPTY_OK)" = 1 ]; then echo "make: this pass selected no test (pytest exit 5): PYTEST_ARGS matches none of its tests"; exit 0; fi; \
	exit $$rc
endef

.PHONY: setup report report-deep report-quick test test-slow test-all test-triton-newest clean-results

setup:
	envs/setup.sh $(VENV)

report: setup
	$(RUN) snakemake --cores $(CORES) report/report.md $(SNAKEMAKE_ARGS) $(if $(CONFIG),--config $(CONFIG))

# The report with the deep target's tables measured too: the headline cases again in fresh
# processes (config `repeats`) and the FP8 rung's convergence (config `convergence`).
report-deep: setup
	$(RUN) snakemake --cores $(CORES) report/report.md $(SNAKEMAKE_ARGS) --config depth=deep $(CONFIG)

# On a GPU, every row of the summary in minutes: results/<hw>-quick/ -> report/quick/report.md.
report-quick: setup
	$(RUN) snakemake --cores $(CORES) report/quick/report.md $(SNAKEMAKE_ARGS) --config scale=quick $(CONFIG)

# Every module's tests with the pinned torch and triton, the smoke workflow run once and shared;
# the tests marked `slow` are left to test-slow.
test: setup
	$(call pytest,python,-m "not slow")

# The rest: the slow end-to-end cases (Snakemake reruns of the built smoke run, the GPU scripts
# on a CPU), then the kernel tests with the newest triton.
test-slow: setup
	$(call pytest,python,-m slow)
	$(MAKE) --no-print-directory test-triton-newest

test-all: test test-slow

# The kernel tests under the newest Triton's interpreter (envs/requirements-triton-newest.txt:
# the same CPU torch, the newest triton), whatever the machine; the Gluon kernels compiled for
# sm_90 with it (tests/sm90.py).
test-triton-newest:
	envs/setup.sh $(NEWEST_VENV) envs/requirements-triton-newest.txt
	$(call pytest,$(NEWEST_VENV)/bin/python,$(KERNEL_TESTS))

# Remove this machine's results (keeps other machines' committed results).
clean-results:
	snakemake --cores 1 --delete-all-output
