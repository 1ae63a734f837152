# End-to-end Transformer timings: one job per (study, model size).
E2E = config["e2e"][SCALE]
E2E_CSVS = wf.e2e_csvs(RESULTS, E2E)


rule e2e_study:
    input:
        model="src/lmperf/model.py",
        code=["src/lmperf/bench/e2e.py", "src/lmperf/flops.py", "src/lmperf/ranges.py", *HARNESS],
    output:
        f"{RESULTS}/e2e/{{study}}/{{size}}.csv",
    log:
        f"{LOGS}/e2e/{{study}}/{{size}}.log",
    params:
        **PROVENANCE,
        spec=lambda w: wf.e2e_spec(config, E2E, w.study, w.size),
    wildcard_constraints:
        study="|".join(E2E["studies"]),
        size="|".join(map(re.escape, config["models"])),
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.bench.e2e --study {wildcards.study} --size {wildcards.size} "
        "--spec {params.spec:q} --out {output} --hw {params.hw} --log {log} "
        "--expect-torch {params.torch} --expect-triton {params.triton}"


rule e2e:
    input:
        E2E_CSVS,
