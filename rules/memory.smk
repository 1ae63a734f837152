# Memory of one forward pass or training step: peaks, snapshot timeline, largest allocations.


rule memory:
    input:
        code=wf.code_inputs("lmperf.bench.memory"),
    output:
        csv=report(wf.output(RESULTS, "memory"), caption="captions/memory.rst", category="Results",
                   subcategory="Memory"),
        html=directory(f"{RESULTS}/memory/html"),  # one snapshot page per case (not in git)
    log:
        f"{LOGS}/memory.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("memory --spec {params.spec:q}")
