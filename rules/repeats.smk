# The headline cases measured again, each time in a fresh process: config `repeats` names timing
# jobs (their results files, without .csv) and case patterns; each run is the job's own command
# and spec with --cases, into <its results folder>/repeats/<job>/run<k>.csv (lmperf.repeats,
# imported as repeat_plan in common.smk). A distributed job's repeats run under torchrun in its
# multi-GPU folder (rules/distributed.smk). The deep target's: the report needs them at config
# `depth: deep` only (rules/report.smk), so a standard run neither runs nor deletes them.
REPEATS = repeat_plan.by_run(RESULT_FILES)  # {(job, k): file}
repeat_plan.check(list(REPEATS.values()), SCALE)


rule repeat:
    input:
        # the job's own code inputs, and the files of the providers the config adds
        code=lambda w: wf.section_code_inputs(REPEATS[w.job, w.k].repeat_of.section, SECTIONS) + wf.provider_inputs(config),
    output:
        csv=report(f"{RESULTS}/repeats/{{job}}/run{{k}}.csv", caption="captions/repeats.rst", category="Results",
                   subcategory="Across processes", labels={"job": "{job}", "process": "{k}"}),
    log:
        f"{LOGS}/repeats/{{job}}/run{{k}}.log",
    params:
        **PROVENANCE,
        command=lambda w: repeat_plan.job_command(REPEATS[w.job, w.k].repeat_of, SECTIONS),
        spec=lambda w: REPEATS[w.job, w.k].spec,
        cases=lambda w: list(REPEATS[w.job, w.k].cases),
    wildcard_constraints:
        job="|".join(sorted({re.escape(j) for j, _ in REPEATS if not j.startswith("distributed/")})) or "(?!)",
        k=r"\d+",
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("{params.command} --spec {params.spec:q} --cases {params.cases:q}")


rule distributed_repeat:
    input:
        code=wf.code_inputs("lmperf.bench.distributed"),
    output:
        report(f"results/{DIST_HW}/repeats/distributed/{{study}}_n{{procs}}/run{{k}}.csv",
               caption="captions/repeats.rst", category="Results", subcategory="Across processes",
               labels={"job": "distributed/{study}_n{procs}", "process": "{k}"}),
    log:
        f"logs/{DIST_HW}/repeats/distributed/{{study}}_n{{procs}}/run{{k}}.log",
    params:
        **{**PROVENANCE, "hw": DIST_HW},
        spec=lambda w: REPEATS[f"distributed/{w.study}_n{w.procs}", w.k].spec,
        cases=lambda w: list(REPEATS[f"distributed/{w.study}_n{w.procs}", w.k].cases),
    resources:
        gpu=lambda w: int(w.procs),
        **cluster.per_gpu_job(SCALE),  # on a cluster: CPUs and memory a rank, torchrun run once (lmperf.cluster)
    wildcard_constraints:
        study="|".join(wf.DISTRIBUTED_STUDIES),
        procs=r"\d+",
        k=r"\d+",
    conda:
        "../envs/lmperf.yaml"
    shell:
        # the command of rule distributed_study (rules/jobs.smk), with --cases
        wf.TORCHRUN + " --standalone --nproc_per_node={wildcards.procs} "
        "-m lmperf.bench.distributed {wildcards.study} --spec {params.spec:q} --cases {params.cases:q} "
        "--out {output} --hw {params.hw} --progress-log {log} --expect-torch {params.torch} "
        "--expect-triton {params.triton}"


rule repeats:
    input:
        [f.path for f in REPEATS.values()],
