# Kernel-level profile of the training step, phase by phase.
PROFILE = config["profile"][SCALE]


rule profile:
    input:
        model="src/lmperf/model.py",
        code=["src/lmperf/bench/profile.py", "src/lmperf/bench/e2e.py", "src/lmperf/ranges.py",
              *HARNESS],
    output:
        f"{RESULTS}/profile/profile.csv",
    log:
        f"{LOGS}/profile.log",
    params:
        **PROVENANCE,
        spec=wf.profile_spec(config, PROFILE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        "python -m lmperf.bench.profile --spec {params.spec:q} --out {output} "
        "--hw {params.hw} --log {log} --expect-torch {params.torch} --expect-triton {params.triton}"
