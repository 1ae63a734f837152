# FlashAttention-2: correctness against float64, then speed against PyTorch's attention.
FA = config["flash_attention"][SCALE]


rule flash_attention_check:
    input:
        code=wf.code_inputs("lmperf.bench.flash_attention") + wf.provider_inputs(config),
    output:
        csv=report(wf.output(RESULTS, "flash_attention_check"), caption="captions/flash_attention.rst",
                   category="Results", subcategory="FlashAttention-2", labels={"job": "check"}),
    log:
        f"{LOGS}/flash_attention/check.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
        workers=wf.workers(FA["check"]),
    threads: wf.workers(FA["check"])  # its worker processes' CPU cores
    priority: PRIORITY_CHECK
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("flash_attention check --spec {params.spec:q} --workers {params.workers}")


rule flash_attention_bench:
    input:
        code=wf.code_inputs("lmperf.bench.flash_attention") + wf.provider_inputs(config),
    output:
        csv=report(wf.output(RESULTS, "flash_attention_bench"), caption="captions/flash_attention.rst",
                   category="Results", subcategory="FlashAttention-2", labels={"job": "{job}"}),
    log:
        f"{LOGS}/flash_attention/bench/{{job}}.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
        workers=wf.workers(FA["bench"]),
    wildcard_constraints:
        job=wf.wildcard(RESULT_FILES, "flash_attention_bench", "job"),
    threads: specs.warm_threads(FA["bench"], workflow.local_exec)  # its worker processes' CPU cores
    priority: PRIORITY_WARMS
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("flash_attention bench --spec {params.spec:q} --workers {params.workers}")


rule flash_attention:
    input:
        wf.paths(RESULT_FILES, "flash_attention"),
