# Memory of one forward pass or training step: peaks, snapshot timeline, largest allocations.
MEMORY = config["memory"][SCALE]


rule memory:
    input:
        model=["src/lmperf/model.py", "src/lmperf/ranges.py"],
        code=["src/lmperf/bench/memory.py", "src/lmperf/bench/e2e.py", *HARNESS],
    output:
        f"{RESULTS}/memory/memory.csv",
    log:
        f"{LOGS}/memory.log",
    params:
        **PROVENANCE,
        spec=wf.memory_spec(config, MEMORY),
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.bench.memory --spec {params.spec:q} --out {output} "
        "--hw {params.hw} --log {log} --expect-torch {params.torch} --expect-triton {params.triton}"
