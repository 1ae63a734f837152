# End-to-end Transformer timings: one job per (study, model size).
E2E = config["e2e"][SCALE]
E2E_JOBS = wf.e2e_jobs(E2E)  # (study, size) pairs: one job and one CSV each


rule e2e_study:
    input:
        model=TRAIN_STEP,
        kernel=lambda w: (["src/lmperf/kernels/flash_attention_triton.py"]  # a study with our attention
                          if wf.e2e_uses_our_attention(E2E["studies"][w.study]) else []),
        optimizer=lambda w: (["src/lmperf/kernels/adamw_master.py"]  # a grid with optimizer 'master'
                             if wf.e2e_uses_master_adamw(E2E["studies"][w.study]) else []),
        code=["src/lmperf/bench/e2e.py", "src/lmperf/flops.py", *HARNESS],
    output:
        csv=f"{RESULTS}/e2e/{{study}}/{{size}}.csv",
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
