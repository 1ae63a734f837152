# The master-weight AdamW: against AdamW in float64 and PyTorch's fused AdamW under bf16 autocast.
# A kernel without a report section of its own: its rows are in the correctness table.
ADAMW_MASTER = config["adamw_master"][SCALE]


rule adamw_master_check:
    input:
        code=wf.code_inputs("lmperf.bench.adamw_master"),
    output:
        csv=report(wf.output(RESULTS, "adamw_master_check"), caption="captions/adamw_master.rst",
                   category="Results", subcategory="AdamW with fp32 masters"),
    log:
        f"{LOGS}/adamw_master/check.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
        workers=wf.workers(ADAMW_MASTER.get("check", {})),
    threads: wf.workers(ADAMW_MASTER.get("check", {}))  # its worker processes' CPU cores
    priority: PRIORITY_CHECK
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("adamw_master check --spec {params.spec:q} --workers {params.workers}")


rule adamw_master:
    input:
        wf.paths(RESULT_FILES, "adamw_master"),
