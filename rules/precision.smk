# Mixed precision: the accumulation experiment and the autocast dtype table on this device.


rule precision:
    input:
        code=["src/lmperf/bench/precision.py", *HARNESS],
    output:
        f"{RESULTS}/precision/precision.csv",
    log:
        f"{LOGS}/precision.log",
    params:
        **PROVENANCE,
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.bench.precision --out {output} "
        "--hw {params.hw} --log {log} --expect-torch {params.torch} --expect-triton {params.triton}"
