rule env:
    input:
        code=["src/lmperf/bench/env.py", *HARNESS],
    output:
        f"{RESULTS}/env/env.csv",
    log:
        f"{LOGS}/env.log",
    params:
        **provenance_params(),
        scale=SCALE,
    conda:
        "../envs/lmperf.yaml"
    shell:
        PYTHON + " -m lmperf.bench.env --out {output} --scale {params.scale} " + PROVENANCE_ARGS
