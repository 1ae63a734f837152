# PyTorch attention: time and memory, eager and compiled (and a user's contenders beside them).
ATTENTION = config["attention"][SCALE]


rule attention:
    input:
        code=wf.code_inputs("lmperf.bench.attention") + wf.provider_inputs(config),
    output:
        csv=report(f"{RESULTS}/attention/attention.csv", caption="captions/attention.rst", category="Results",
                   subcategory="Attention in PyTorch"),
    log:
        f"{LOGS}/attention.log",
    params:
        **PROVENANCE,
        spec=wf.attention_spec(config, ATTENTION),
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("attention --spec {params.spec:q}")
