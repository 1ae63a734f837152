# End-to-end Transformer timings: one job per (study, model size).
E2E = config["e2e"][SCALE]
E2E_JOBS = wf.e2e_jobs(E2E)  # (study, size) pairs: one job and one CSV each


rule e2e_study:
    input:
        code=wf.code_inputs("lmperf.bench.e2e"),
    output:
        csv=report(f"{RESULTS}/e2e/{{study}}/{{size}}.csv", caption="captions/e2e.rst", category="Results",
                   subcategory="End-to-end timings", labels={"study": "{study}", "model": "{size}"}),
    log:
        f"{LOGS}/e2e/{{study}}/{{size}}.log",
    params:
        **PROVENANCE,
        spec=lambda w: wf.e2e_spec(config, E2E, w.study, w.size),
    wildcard_constraints:
        study="|".join(E2E["studies"]),
        size="|".join(map(re.escape, config["models"])),
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("e2e --study {wildcards.study} --size {wildcards.size} --spec {params.spec:q}")


rule e2e:
    input:
        expand(rules.e2e_study.output.csv, zip, study=[s for s, _ in E2E_JOBS], size=[z for _, z in E2E_JOBS]),
