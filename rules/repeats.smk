# The headline cases measured again, each time in a fresh process: config `repeats` names timing
# jobs (their results files under results/<hw>/, without .csv) and case patterns; each run is
# the job's own command and spec with --cases, into results/<hw>/repeats/<job>/run<k>.csv
# (lmperf.repeats, imported as repeat_plan in common.smk).
REPEATS = repeat_plan.by_run(wf.result_files(config, RESULTS, SCALE, []), RESULTS)  # {(job, k): ResultFile}
repeat_plan.check(list(REPEATS.values()), SCALE)


rule repeat:
    input:
        code=lambda w: wf.code_inputs(f"lmperf.bench.{REPEATS[w.job, w.k].repeat_of.section}"),
    output:
        csv=f"{RESULTS}/repeats/{{job}}/run{{k}}.csv",
    log:
        f"{LOGS}/repeats/{{job}}/run{{k}}.log",
    params:
        **PROVENANCE,
        command=lambda w: repeat_plan.job_command(REPEATS[w.job, w.k].repeat_of),
        spec=lambda w: REPEATS[w.job, w.k].spec,
        cases=lambda w: list(REPEATS[w.job, w.k].cases),
    wildcard_constraints:
        job="|".join(sorted({re.escape(job) for job, _ in REPEATS})) or "(?!)",
        k=r"\d+",
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("{params.command} --spec {params.spec:q} --cases {params.cases:q}")


rule repeats:
    input:
        [f.path for f in REPEATS.values()],
