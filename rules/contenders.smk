# Contenders (config `contenders`): a user's adapter module checked against float64 and against one
# process; its timings run in the benchmarks whose contract it implements. lmperf.contenders finds
# it while planning (rules/common.smk); its code inputs are its repository's Python files.
CONTENDER_FILES = contenders_mod.code_inputs(config.get("contenders"))


rule contenders_study:
    input:
        code=wf.code_inputs("lmperf.bench.contenders"),
        contenders=CONTENDER_FILES,
    output:
        csv=report(wf.output(RESULTS, "contenders_study"), caption="captions/contenders.rst", category="Results",
                   subcategory="Contenders", labels={"study": "{study}"}),
    log:
        f"{LOGS}/contenders/{{study}}.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
    wildcard_constraints:
        study=wf.wildcard(RESULT_FILES, "contenders_study", "study"),
    priority: PRIORITY_CHECK
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("contenders {wildcards.study} --spec {params.spec:q}")


rule contenders:
    input:
        wf.paths(RESULT_FILES, "contenders"),
