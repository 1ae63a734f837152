# Multi-dimensional LRPE-cosine: correctness against float64, then speed and memory.
LRPE = config["lrpe"][SCALE]
LRPE_DIMS = [str(g["dims"]) for g in LRPE["bench"]["grids"]]
LRPE_CSVS = [f"{RESULTS}/lrpe/check.csv"] + [f"{RESULTS}/lrpe/bench_{m}d.csv" for m in LRPE_DIMS]


rule lrpe_check:
    input:
        kernel="src/lmperf/kernels/lrpe.py",
        code=["src/lmperf/bench/lrpe.py", *HARNESS],
    output:
        f"{RESULTS}/lrpe/check.csv",
    log:
        f"{LOGS}/lrpe/check.log",
    params:
        **PROVENANCE,
        spec=wf.lrpe_check_spec(LRPE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.bench.lrpe check --spec {params.spec:q} --out {output} "
        "--hw {params.hw} --log {log} --expect-torch {params.torch} --expect-triton {params.triton}"


rule lrpe_bench:
    input:
        kernel="src/lmperf/kernels/lrpe.py",
        code=["src/lmperf/bench/lrpe.py", *HARNESS],
    output:
        f"{RESULTS}/lrpe/bench_{{dims}}d.csv",
    log:
        f"{LOGS}/lrpe/bench_{{dims}}d.log",
    params:
        **PROVENANCE,
        spec=lambda w: wf.lrpe_bench_spec(LRPE, w.dims),
    wildcard_constraints:
        dims="|".join(LRPE_DIMS),
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.bench.lrpe bench --spec {params.spec:q} --out {output} "
        "--hw {params.hw} --log {log} --expect-torch {params.torch} --expect-triton {params.triton}"


rule lrpe:
    input:
        LRPE_CSVS,
