# End-to-end Transformer timings: one job per (study, model size).


rule e2e_study:
    input:
        code=wf.code_inputs("lmperf.bench.e2e"),
    output:
        csv=report(wf.output(RESULTS, "e2e_study"), caption="captions/e2e.rst", category="Results",
                   subcategory="End-to-end timings", labels={"study": "{study}", "model": "{size}"}),
    log:
        f"{LOGS}/e2e/{{study}}/{{size}}.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
    wildcard_constraints:
        study=wf.wildcard(RESULT_FILES, "e2e_study", "study"),
        size=wf.wildcard(RESULT_FILES, "e2e_study", "size"),
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("e2e --study {wildcards.study} --size {wildcards.size} --spec {params.spec:q}")


rule e2e:
    input:
        wf.paths(RESULT_FILES, "e2e"),
