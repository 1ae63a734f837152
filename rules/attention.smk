# PyTorch attention: time and memory, eager and compiled.
ATTENTION = config["attention"][SCALE]


rule attention:
    input:
        code=wf.code_inputs("lmperf.bench.attention"),
    output:
        csv=report(f"{RESULTS}/attention/attention.csv", caption="captions/attention.rst", category="Results",
                   subcategory="Attention in PyTorch"),
    log:
        f"{LOGS}/attention.log",
    params:
        **PROVENANCE,
        spec=json.dumps(ATTENTION, sort_keys=True),
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("attention --spec {params.spec:q}")
