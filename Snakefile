# lmperf: benchmarks -> tidy CSVs under results/<hw>/ -> report/report.md.
#   snakemake --cores 1 report/report.md                 # the whole report
#   snakemake --cores 1 e2e                              # one section's results
#   snakemake --cores 1 report/report.md --config scale=smoke
#   snakemake --cores 1 report/report.md --config depth=deep    # the deep target's tables too
#   snakemake --cores 1 report/quick/report.md --config scale=quick   # a GPU: the summary's cases
#   snakemake --report report/lmperf.html                # after a run: report, figures, CSVs, DAG in one page
# Every section's jobs are rules of rules/jobs.smk, one generic rule per job kind, made from the
# sections' declarations (lmperf.declare); helpers and config checks are in common.smk.

configfile: "config/config.yaml"


# What `snakemake --report` says of the workflow; each result's caption is in rules/captions/ too.
report: "rules/captions/workflow.rst"


include: "rules/common.smk"
include: "rules/jobs.smk"
include: "rules/repeats.smk"
include: "rules/report.smk"
include: "rules/compare.smk"


rule all:
    input:
        REPORT,  # report/report.md (report/quick/report.md at the quick scale)
    default_target: True
