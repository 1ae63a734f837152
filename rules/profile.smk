# Kernel-level profile of the training step, phase by phase.


rule profile:
    input:
        code=wf.code_inputs("lmperf.bench.profile"),
    output:
        csv=report(wf.output(RESULTS, "profile"), caption="captions/profile.rst", category="Results",
                   subcategory="Kernel-level profile"),
    log:
        f"{LOGS}/profile.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("profile --spec {params.spec:q}")
