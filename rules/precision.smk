# Mixed precision: the accumulation experiment and the autocast dtype table on this device.


rule precision:
    input:
        code=wf.code_inputs("lmperf.bench.precision"),
    output:
        csv=report(wf.output(RESULTS, "precision"), caption="captions/precision.rst", category="Results",
                   subcategory="Mixed precision"),
    log:
        f"{LOGS}/precision.log",
    params:
        **PROVENANCE,
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("precision")
