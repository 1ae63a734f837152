rule env:
    input:
        code=["src/lmperf/bench/env.py", *HARNESS],
    output:
        f"{RESULTS}/env/env.csv",
    log:
        f"{LOGS}/env.log",
    params:
        **PROVENANCE,
        scale=SCALE,
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.bench.env --out {output} --scale {params.scale} --hw {params.hw} "
        "--log {log} --expect-torch {params.torch} --expect-triton {params.triton}"
