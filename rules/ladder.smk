# The ladder: from the assignment's setting to the GPU's limit, one change a rung; one job per
# model size, every rung of that size in it.
LADDER = config["ladder"][SCALE]


rule ladder_size:
    input:
        code=wf.code_inputs("lmperf.bench.ladder") + wf.provider_inputs(config),
    output:
        csv=report(f"{RESULTS}/ladder/{{size}}.csv", caption="captions/ladder.rst", category="Results",
                   subcategory="The ladder", labels={"model": "{size}"}),
    log:
        f"{LOGS}/ladder/{{size}}.log",
    params:
        **PROVENANCE,
        spec=lambda w: wf.ladder_spec(config, LADDER, w.size),
        workers=wf.workers(LADDER),
    threads: wf.workers(LADDER)  # its worker processes' CPU cores (they compile before the timed loop)
    wildcard_constraints:
        size="|".join(map(re.escape, LADDER["sizes"])),
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("ladder --size {wildcards.size} --spec {params.spec:q} --workers {params.workers}")


rule ladder:
    input:
        expand(rules.ladder_size.output.csv, size=LADDER["sizes"]),
