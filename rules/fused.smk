# The fused kernels (RMSNorm with the residual add, SwiGLU's product, RoPE) and the model patched
# to run them, against float64. Kernels without a report section of their own: their rows are in
# the correctness table. A scale whose config has no fused check has no job.
FUSED = config["fused"][SCALE]


rule fused_check:
    input:
        code=wf.code_inputs("lmperf.bench.fused"),
    output:
        csv=report(wf.output(RESULTS, "fused_check"), caption="captions/fused.rst", category="Results",
                   subcategory="Fused kernels", labels={"job": "check"}),
    log:
        f"{LOGS}/fused/check.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
        workers=wf.workers(FUSED.get("check", {})),
    threads: wf.workers(FUSED.get("check", {}))  # its worker processes' CPU cores
    priority: PRIORITY_CHECK
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("fused check --spec {params.spec:q} --workers {params.workers}")


rule fused:
    input:
        wf.paths(RESULT_FILES, "fused"),
