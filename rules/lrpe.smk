# Multi-dimensional LRPE-cosine: correctness against float64, then speed and memory.
LRPE = config["lrpe"][SCALE]
LRPE_DIMS = [str(g["dims"]) for g in LRPE["bench"]["grids"]]


rule lrpe_check:
    input:
        code=wf.code_inputs("lmperf.bench.lrpe"),
    output:
        csv=report(f"{RESULTS}/lrpe/check.csv", caption="captions/lrpe.rst", category="Results",
                   subcategory="LRPE-cosine", labels={"job": "check"}),
    log:
        f"{LOGS}/lrpe/check.log",
    params:
        **PROVENANCE,
        spec=wf.lrpe_check_spec(LRPE),
        workers=wf.workers(LRPE["check"]),
    threads: wf.workers(LRPE["check"])  # its worker processes' CPU cores
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("lrpe check --spec {params.spec:q} --workers {params.workers}")


rule lrpe_bench:
    input:
        code=wf.code_inputs("lmperf.bench.lrpe"),
    output:
        csv=report(f"{RESULTS}/lrpe/bench_{{dims}}d.csv", caption="captions/lrpe.rst", category="Results",
                   subcategory="LRPE-cosine", labels={"job": "bench {dims}-D"}),
    log:
        f"{LOGS}/lrpe/bench_{{dims}}d.log",
    params:
        **PROVENANCE,
        spec=lambda w: wf.lrpe_bench_spec(LRPE, w.dims),
        workers=wf.workers(LRPE["bench"]),
    wildcard_constraints:
        dims="|".join(LRPE_DIMS),
    threads: wf.workers(LRPE["bench"])  # its worker processes' CPU cores
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("lrpe bench --spec {params.spec:q} --workers {params.workers}")


rule lrpe:
    input:
        rules.lrpe_check.output.csv,
        expand(rules.lrpe_bench.output.csv, dims=LRPE_DIMS),
