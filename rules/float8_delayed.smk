# Float8 training's kernels and layers (kernels/float8_delayed.py) against float64 and PyTorch's
# fp8 rounding. No report section of their own: their rows are in the correctness table. A scale
# whose config has no float8 check has no job.
FLOAT8 = config["float8_delayed"][SCALE]


rule float8_delayed_check:
    input:
        code=wf.code_inputs("lmperf.bench.float8_delayed"),
    output:
        csv=report(wf.output(RESULTS, "float8_delayed_check"), caption="captions/float8_delayed.rst", category="Results",
                   subcategory="Float8 training", labels={"job": "check"}),
    log:
        f"{LOGS}/float8_delayed/check.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
        workers=wf.workers(FLOAT8.get("check", {})),
    threads: wf.workers(FLOAT8.get("check", {}))  # its worker processes' CPU cores
    priority: PRIORITY_CHECK
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("float8_delayed check --spec {params.spec:q} --workers {params.workers}")


rule float8_delayed:
    input:
        wf.paths(RESULT_FILES, "float8_delayed"),
