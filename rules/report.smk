REPORT_FIGURES = ["report/figures/e2e_step_vs_size.png", "report/figures/e2e_step_vs_context.png",
                  "report/figures/fa_tflops_vs_seq_len.png", "report/figures/lrpe_bandwidth.png",
                  "report/figures/attention_vs_seq_len.png", "report/figures/memory_timelines.png"]


rule report:
    input:
        # Every CSV a full run writes at this scale: the same list the report names as missing
        # when it renders from an incomplete folder (lmperf.workflow.expected_csvs).
        results=wf.expected_csvs(config, SCALE, RESULTS),
        templates=sorted(str(p) for p in Path("templates").glob("*.md.j2")),
        code=["src/lmperf/report/__main__.py", "src/lmperf/report/render.py",
              "src/lmperf/report/sections.py", "src/lmperf/report/figures.py"],
    output:
        report="report/report.md",
        figures=REPORT_FIGURES,
    log:
        f"{LOGS}/report.log",
    params:
        hw=HW,
        scale=SCALE,
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.report --results results/{params.hw} --scale {params.scale} "
        "--templates templates --out {output.report} --figures report/figures > {log} 2>&1"
