# Multi-dimensional LRPE-cosine: correctness against float64, then speed and memory.
LRPE = config["lrpe"][SCALE]


rule lrpe_check:
    input:
        code=wf.code_inputs("lmperf.bench.lrpe"),
    output:
        csv=report(wf.output(RESULTS, "lrpe_check"), caption="captions/lrpe.rst", category="Results",
                   subcategory="LRPE-cosine", labels={"job": "check"}),
    log:
        f"{LOGS}/lrpe/check.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
        workers=wf.workers(LRPE["check"]),
    threads: wf.workers(LRPE["check"])  # its worker processes' CPU cores
    priority: PRIORITY_CHECK
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("lrpe check --spec {params.spec:q} --workers {params.workers}")


rule lrpe_bench:
    input:
        code=wf.code_inputs("lmperf.bench.lrpe"),
    output:
        csv=report(wf.output(RESULTS, "lrpe_bench"), caption="captions/lrpe.rst", category="Results",
                   subcategory="LRPE-cosine", labels={"job": "bench {dims}-D"}),
    log:
        f"{LOGS}/lrpe/bench_{{dims}}d.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
        workers=wf.workers(LRPE["bench"]),
    wildcard_constraints:
        dims=wf.wildcard(RESULT_FILES, "lrpe_bench", "dims"),
    threads: wf.workers(LRPE["bench"])  # its worker processes' CPU cores
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("lrpe bench --spec {params.spec:q} --workers {params.workers}")


rule lrpe:
    input:
        wf.paths(RESULT_FILES, "lrpe"),
