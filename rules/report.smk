# The report: every section's results (the outputs of the rule named after the section) ->
# report/report.md and its figures. Sections, their figures and their order: lmperf.report.sections.
from lmperf.report import validate as results_check  # noqa: E402
from lmperf.report.sections import result_dirs  # noqa: E402


# A section's results are the inputs of the rule named after it: its files among RESULT_FILES
# (common.smk), whose paths the benchmark rules' outputs share (the jobs' declared layout); for
# `distributed` those are results/<gpu>-x<count>/distributed/*.csv on this machine (results/cpu/
# on a CPU), which the renderer reads beside results/<hw>/ (lmperf.report.sections.result_dirs).
# the grids (what each result file must hold) and the bars, hw and scale left to each rule
REPORT_CONFIG = json.dumps({k: v for k, v in config.items() if k not in ("hw", "scale")}, sort_keys=True)


rule report:
    input:
        # Every CSV a run writes at this scale and depth, checked while the DAG is built: a
        # damaged one is named and its job forced to rerun. At depth standard the deep target's
        # (repeats, convergence) are no inputs: not measured, not deleted; the renderer reads
        # those there are.
        results=lambda w: wf.checked_results(tuple(wf.run_files(RESULT_FILES, DEPTH)), workflow.dag,
                                             results_check.damaged),
        templates=sorted(str(p) for p in Path("templates").glob("*.md.j2")),
        code=sorted(str(p) for p in Path("src/lmperf/report").glob("*.py")),
        # the sections' declarations (their order, figures, templates), and the files of those the config adds
        sections=["src/lmperf/catalog.py", "src/lmperf/declare.py", *wf.section_files(SECTIONS)],
        # the providers' labels and roles (the peer columns), and the files of those the config adds
        providers=["src/lmperf/providers.py", *wf.provider_inputs(config)],
        # the headline jobs rerun on a fresh machine, judged by lmperf.compare ("Across processes")
        rerun=sorted(str(p) for p in Path(f"{RESULTS}-rerun").rglob("*.csv") if ".journal" not in p.parts),
        compare=wf.code_inputs("lmperf.compare"),
        references="config/references.yaml",
        published=sorted(str(p) for p in Path("config/published").glob("*.csv")),
        references_schema="config/references.schema.yaml",
    output:
        # update(): Snakemake neither deletes them before the job nor keeps a failed render's;
        # a failed render leaves the previous report and figures as they were. The figures are
        # a folder: a figure whose section has no rows is not drawn (the report says why).
        report=update(report(REPORT, caption="captions/report.rst", category="Report")),
        figures=update(report(directory(str(Path(REPORT).parent / "figures")), patterns=["{figure}.png"], caption="captions/figures.rst",
                              category="Figures", labels={"figure": "{figure}"})),
    log:
        f"{LOGS}/report.log",
    params:
        hw=HW,
        scale=SCALE,
        dist_hw=DIST_HW,
        config=REPORT_CONFIG,
    resources:
        **cluster.job(SCALE, "report"),  # no GPU
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.report --results results/{params.hw} --scale {params.scale} "
        "--templates templates --out {output.report} --figures {output.figures} "
        "--config-json {params.config:q} --only-configured-contenders --distributed results/{params.dist_hw} "
        "--references {input.references} > {log} 2>&1"


# Another GPU's results rendered alone, e.g. `snakemake --cores 1 report/h200/report.md`: what
# results/<hw>/ holds, at the scale it was measured at (its env.csv), measuring nothing; the
# files a full run would add are listed under the report's heading. The multi-GPU section reads
# the results/<hw>-x<N> folders there are.
rule hw_report:
    input:
        # its own CSVs and those of the multi-GPU folders its report reads (results/<hw>-x<N>)
        results=lambda w: sorted(str(p) for d in [Path(f"results/{w.hw}"), *result_dirs(f"results/{w.hw}", "distributed")[1:]]
                                 for p in d.rglob("*.csv") if ".journal" not in p.parts),
        templates=sorted(str(p) for p in Path("templates").glob("*.md.j2")),
        code=sorted(str(p) for p in Path("src/lmperf/report").glob("*.py")),
        providers=["src/lmperf/providers.py", *wf.provider_inputs(config)],
        references="config/references.yaml",
        published=sorted(str(p) for p in Path("config/published").glob("*.csv")),
    output:
        report=update("report/{hw}/report.md"),
        figures=update(directory("report/{hw}/figures")),
    log:
        "logs/report/{hw}.log",
    params:
        scale=lambda w: wf.measured_scale(f"results/{w.hw}"),
        config=REPORT_CONFIG,
    resources:
        **cluster.job(SCALE, "report"),  # no GPU
    wildcard_constraints:
        hw=r"(?!quick/)[^/]+",  # report/quick/: the quick scale's report (rule report)
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.report --results results/{wildcards.hw} --scale {params.scale} "
        "--templates templates --out {output.report} --figures {output.figures} "
        "--config-json {params.config:q} --references {input.references} > {log} 2>&1"
