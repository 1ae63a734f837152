# Contenders (config `contenders`): a user's adapter module checked against float64 and against one
# process; its timings run in the benchmarks whose contract it implements. lmperf.contenders loads
# it while planning (rules/common.smk): a module that does not import stops the run, naming it.
CONTENDER_FILES = contenders_mod.code_inputs(config.get("contenders"))
CONTENDER_CSVS = contenders_mod.result_paths(config, RESULTS)


rule contenders_study:
    input:
        code=wf.code_inputs("lmperf.bench.contenders"),
        contenders=CONTENDER_FILES,
    output:
        csv=report(f"{RESULTS}/contenders/{{study}}.csv", caption="captions/contenders.rst", category="Results",
                   subcategory="Contenders", labels={"study": "{study}"}),
    log:
        f"{LOGS}/contenders/{{study}}.log",
    params:
        **PROVENANCE,
        spec=lambda w: contenders_mod.study_spec(config, SCALE, w.study),
    wildcard_constraints:
        study="|".join(contenders_mod.STUDIES),
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("contenders {wildcards.study} --spec {params.spec:q}")


rule contenders:
    input:
        CONTENDER_CSVS,
