# The report: every section's results (the outputs of the rule named after the section) ->
# report/report.md and its figures. Sections, their figures and their order: lmperf.report.sections.
from lmperf.report.sections import SECTIONS, figure_paths  # noqa: E402


# A section's results are the outputs of the rule named after it; for `distributed` those are
# results/<gpu>-x<count>/distributed/*.csv on this machine (results/cpu/ on a CPU), which the
# renderer reads beside results/<hw>/ (lmperf.report.sections.result_dirs).
RULE_NAMES = {r.name for r in workflow.rules}  # sections without results (correctness) have none
REPORT_RESULTS = [f for s in SECTIONS if s.name in RULE_NAMES for f in wf.results_of(getattr(rules, s.name))]


rule report:
    input:
        # Every CSV a full run writes at this scale; the renderer names the missing ones when it
        # renders from an incomplete folder (they reach it as params.expected).
        results=REPORT_RESULTS,
        templates=sorted(str(p) for p in Path("templates").glob("*.md.j2")),
        code=sorted(str(p) for p in Path("src/lmperf/report").glob("*.py")),
    output:
        report="report/report.md",
        figures=[str(p) for p in figure_paths("report/figures").values()],
    log:
        f"{LOGS}/report.log",
    params:
        hw=HW,
        scale=SCALE,
        bars=json.dumps(config["report"], sort_keys=True),
        expected=lambda wildcards, input: json.dumps(list(input.results)),
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.report --results results/{params.hw} --scale {params.scale} "
        "--templates templates --out {output.report} --figures report/figures "
        "--bars {params.bars:q} --expected {params.expected:q} > {log} 2>&1"
