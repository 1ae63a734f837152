# The ladder: from the assignment's setting to the GPU's limit, one change a rung; one job per
# model size, every rung of that size in it.
LADDER = config["ladder"][SCALE]


rule ladder_size:
    input:
        code=wf.code_inputs("lmperf.bench.ladder") + wf.provider_inputs(config),
    output:
        csv=report(wf.output(RESULTS, "ladder_size"), caption="captions/ladder.rst", category="Results",
                   subcategory="The ladder", labels={"model": "{size}"}),
    log:
        f"{LOGS}/ladder/{{size}}.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
        workers=wf.workers(LADDER),
        **wf.cases_params(LADDER),  # only the rungs the scale's `cases` name (the quick scale's)
    threads: specs.warm_threads(LADDER, workflow.local_exec)  # its worker processes' CPU cores (they compile before the timed loop)
    wildcard_constraints:
        size=wf.wildcard(RESULT_FILES, "ladder_size", "size"),
    priority: PRIORITY_LONG_WARMS
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench(wf.with_cases("ladder --size {wildcards.size} --spec {params.spec:q} --workers {params.workers}", LADDER))


rule ladder:
    input:
        wf.paths(RESULT_FILES, "ladder"),
