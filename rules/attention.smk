# PyTorch attention: time and memory, eager and compiled.
ATTENTION = config["attention"][SCALE]


rule attention:
    input:
        model=["src/lmperf/model.py", "src/lmperf/ranges.py"],
        code=["src/lmperf/bench/attention.py", *HARNESS],
    output:
        f"{RESULTS}/attention/attention.csv",
    log:
        f"{LOGS}/attention.log",
    params:
        **PROVENANCE,
        spec=json.dumps(ATTENTION, sort_keys=True),
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.bench.attention --spec {params.spec:q} --out {output} "
        "--hw {params.hw} --log {log} --expect-torch {params.torch} --expect-triton {params.triton}"
