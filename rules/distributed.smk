# Scaling across GPUs: all-reduce and the data-parallel training step, one torchrun job per study
# and process count, each declaring as many GPUs. Results go to their own folder, named with the
# GPU count (results/h200-x2/), so single- and multi-GPU runs never mix.
DIST = config["distributed"][SCALE]


rule distributed_study:
    input:
        code=wf.code_inputs("lmperf.bench.distributed") + wf.provider_inputs(config),
    output:
        report(wf.output(f"results/{DIST_HW}", "distributed_study"), caption="captions/distributed.rst",
               category="Results", subcategory="Scaling across GPUs",
               labels={"study": "{study}", "processes": "{procs}"}),
    log:
        f"logs/{DIST_HW}/distributed/{{study}}_n{{procs}}.log",
    params:
        **{**PROVENANCE, "hw": DIST_HW},
        spec=lambda w: wf.distributed_spec(config, DIST, w.study),
    resources:
        gpu=lambda w: int(w.procs),
        **cluster.per_gpu_job(SCALE),  # on a cluster: CPUs and memory a rank, torchrun run once (lmperf.cluster)
    wildcard_constraints:
        study="|".join(wf.DISTRIBUTED_STUDIES),
        procs=r"\d+",
    conda:
        "../envs/lmperf.yaml"
    shell:
        # torchrun, run as `python -m torch.distributed.run` so that it is the environment's own
        wf.TORCHRUN + " --standalone --nproc_per_node={wildcards.procs} "
        "-m lmperf.bench.distributed {wildcards.study} --spec {params.spec:q} --out {output} "
        "--hw {params.hw} --progress-log {log} --expect-torch {params.torch} --expect-triton {params.triton}"


rule distributed:
    input:
        wf.paths(RESULT_FILES, "distributed"),
