# Every benchmark job of every section, from the sections' declarations (SECTIONS, common.smk:
# lmperf.catalog and config `sections`): one generic rule per job kind (lmperf.declare.KINDS),
# each made once a declared job, under the job's name. Its output is the job's declared result
# file (lmperf.workflow.layout), its spec the one lmperf.workflow.result_files planned for that
# file, its code inputs every file its module can import; its command is the job's declared
# arguments after `python -m <the section's bench module>`.
# Variables of the loop reach a rule's functions as default arguments (bound when it is made).
# A rule's `shell:` is evaluated when it is made and again when its job runs, after the loops:
# it is looked up by the rule's name (`rule` when the job runs), in SHELLS.
SHELLS = {JOB.rule: wf.job_shell(config, SECTION, JOB, SCALE) for SECTION, JOB in wf.jobs(SECTIONS, "check") + wf.jobs(SECTIONS, "bench")}
SHELLS.update({JOB.rule: wf.study_shell(SECTION, JOB) for SECTION, JOB in wf.jobs(SECTIONS, "study")})


# check: correctness against a reference; checks share the device, so they start first.
for SECTION, JOB in wf.jobs(SECTIONS, "check"):

    rule:
        name:
            JOB.rule
        input:
            code=wf.job_code(config, SECTION, JOB),
            **(JOB.inputs(config) if JOB.inputs else {}),
        output:
            csv=report(wf.output(RESULTS, JOB.rule, SECTIONS), caption=SECTION.caption_path(), category="Results",
                       subcategory=SECTION.subcategory, labels=JOB.labels),
        log:
            wf.job_log(LOGS, JOB),
        params:
            **PROVENANCE,
            spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
            **wf.job_params(config, SECTION, JOB, SCALE),
        threads: wf.job_threads(config, SECTION, JOB, SCALE, workflow.local_exec)  # its worker processes' CPU cores
        priority: PRIORITY_CHECK
        wildcard_constraints:
            **wf.constraints(RESULT_FILES, JOB),
        resources:
            gpu=1,
            **cluster.job(SCALE),
        conda:
            "../envs/lmperf.yaml"
        shell:
            SHELLS[locals().get("rule", JOB.rule)]


# bench: one process that times or records, the device to itself once its workers have warmed.
for SECTION, JOB in wf.jobs(SECTIONS, "bench"):

    rule:
        name:
            JOB.rule
        input:
            code=wf.job_code(config, SECTION, JOB),
            **(JOB.inputs(config) if JOB.inputs else {}),
        output:
            csv=report(wf.output(RESULTS, JOB.rule, SECTIONS), caption=SECTION.caption_path(), category="Results",
                       subcategory=SECTION.subcategory, labels=JOB.labels),
            **{name: directory(path) for name, path in wf.job_outputs(RESULTS, JOB).items()},
        log:
            wf.job_log(LOGS, JOB),
        params:
            **PROVENANCE,
            **({"spec": lambda w, output: wf.spec_of(RESULT_FILES, output.csv)} if JOB.spec else {}),
            **wf.job_params(config, SECTION, JOB, SCALE),
        threads: wf.job_threads(config, SECTION, JOB, SCALE, workflow.local_exec)  # its worker processes' CPU cores (those that warm compiles: one in a local run)
        priority: JOB.priority or 0
        wildcard_constraints:
            **wf.constraints(RESULT_FILES, JOB),
        resources:
            gpu=1,
            **cluster.job(SCALE),
        conda:
            "../envs/lmperf.yaml"
        shell:
            SHELLS[locals().get("rule", JOB.rule)]


# study: one job over several processes, under torchrun (run as `python -m torch.distributed.run`
# so that it is the environment's own), declaring as many GPUs. Its results go to their own
# folder, named with the GPU count (results/h200-x2/), so single- and multi-GPU runs never mix.
for SECTION, JOB in wf.jobs(SECTIONS, "study"):

    rule:
        name:
            JOB.rule
        input:
            code=wf.job_code(config, SECTION, JOB),
        output:
            csv=report(wf.output(f"results/{DIST_HW}", JOB.rule, SECTIONS), caption=SECTION.caption_path(),
                       category="Results", subcategory=SECTION.subcategory, labels=JOB.labels),
        log:
            wf.job_log(f"logs/{DIST_HW}", JOB),
        params:
            **{**PROVENANCE, "hw": DIST_HW},
            # any process count: a job asked for by name that the config does not plan runs too
            spec=lambda w, section=SECTION, job=JOB: wf.study_spec(config, section, job, SCALE, w),
        resources:
            gpu=lambda w: int(w.procs),
            **cluster.per_gpu_job(SCALE),  # on a cluster: CPUs and memory a rank, torchrun run once (lmperf.cluster)
        wildcard_constraints:
            **wf.constraints(RESULT_FILES, JOB),
        conda:
            "../envs/lmperf.yaml"
        shell:
            SHELLS[locals().get("rule", JOB.rule)]


# A section's own target (`snakemake --cores 1 e2e`): all its result files at this scale, a
# section's deep grid (a file the deep target alone measures) at depth deep only.
for SECTION in wf.aggregates(SECTIONS):

    rule:
        name:
            SECTION.name
        input:
            wf.paths([f for f in RESULT_FILES if DEPTH == "deep" or not f.deep], SECTION.name),
