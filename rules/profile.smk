# Kernel-level profile of the training step, phase by phase.
PROFILE = config["profile"][SCALE]


rule profile:
    input:
        code=wf.code_inputs("lmperf.bench.profile"),
    output:
        csv=report(f"{RESULTS}/profile/profile.csv", caption="captions/profile.rst", category="Results",
                   subcategory="Kernel-level profile"),
    log:
        f"{LOGS}/profile.log",
    params:
        **PROVENANCE,
        spec=wf.profile_spec(config, PROFILE),
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("profile --spec {params.spec:q}")
