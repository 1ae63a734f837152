# End-to-end Transformer timings: one job per (study, model size).
E2E = config["e2e"][SCALE]
E2E_CSVS = [f"{RESULTS}/e2e/{study}/{size}.csv"
            for study, spec in E2E["studies"].items() for size in spec["sizes"]]


def e2e_spec(wildcards):
    spec = E2E["studies"][wildcards.study]
    return json.dumps({"batch_size": E2E["batch_size"], "timed_steps": E2E["timed_steps"],
                       "attention": spec["attention"], "grid": spec["grid"],
                       "models": {wildcards.size: config["models"][wildcards.size]}},
                      sort_keys=True)


rule e2e_study:
    input:
        model="src/lmperf/model.py",
        code=["src/lmperf/bench/e2e.py", "src/lmperf/flops.py", *HARNESS],
    output:
        f"{RESULTS}/e2e/{{study}}/{{size}}.csv",
    log:
        f"{LOGS}/e2e/{{study}}/{{size}}.log",
    params:
        **provenance_params(),
        spec=e2e_spec,
    wildcard_constraints:
        study="|".join(E2E["studies"]),
        size="|".join(map(re.escape, config["models"])),
    conda:
        "../envs/lmperf.yaml"
    shell:
        PYTHON + " -m lmperf.bench.e2e --study {wildcards.study} --size {wildcards.size} "
        "--spec {params.spec:q} --out {output} " + PROVENANCE_ARGS


rule e2e:
    input:
        E2E_CSVS,
