# Mixed precision: the accumulation experiment and the autocast dtype table on this device.


rule precision:
    input:
        code=["src/lmperf/bench/precision.py", *HARNESS],
    output:
        csv=f"{RESULTS}/precision/precision.csv",
    log:
        f"{LOGS}/precision.log",
    params:
        **PROVENANCE,
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("precision")
