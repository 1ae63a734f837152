rule env:
    input:
        code=wf.code_inputs("lmperf.bench.env"),
    output:
        csv=report(wf.output(RESULTS, "env"), caption="captions/env.rst", category="Results",
                   subcategory="Environment"),
    log:
        f"{LOGS}/env.log",
    params:
        **PROVENANCE,
        scale=SCALE,
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("env --scale {params.scale}")
