# The two commands of the README: `make report` and `make test`. Both set up .venv first.
VENV ?= .venv
CORES ?= 1
SNAKEMAKE_ARGS ?=
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: setup report test clean-results

setup:
	envs/setup.sh $(VENV)

report: setup
	snakemake --cores $(CORES) report/report.md $(SNAKEMAKE_ARGS)

test: setup
	python -m pytest $(PYTEST_ARGS)

# Remove this machine's results (keeps other machines' committed results).
clean-results:
	snakemake --cores 1 --delete-all-output
