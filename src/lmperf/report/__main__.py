"""`python -m lmperf.report`: the report rendered from one results folder (lmperf.report.render)."""
from lmperf.report.render import main

main()
