# PyTorch attention: time and memory, eager and compiled (and a user's contenders beside them).


rule attention:
    input:
        code=wf.code_inputs("lmperf.bench.attention") + wf.provider_inputs(config),
    output:
        csv=report(wf.output(RESULTS, "attention"), caption="captions/attention.rst", category="Results",
                   subcategory="Attention in PyTorch"),
    log:
        f"{LOGS}/attention.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
        workers=wf.workers(config["attention"][SCALE]),
    threads: specs.warm_threads(config["attention"][SCALE], workflow.local_exec)  # its worker processes' CPU cores (they compile first)
    priority: PRIORITY_LONG_WARMS
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("attention --spec {params.spec:q} --workers {params.workers}")
