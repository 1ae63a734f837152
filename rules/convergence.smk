# The FP8 rung's convergence: the loss of every step on one fixed token stream, bf16 (twice: the
# second on another draw of the stream, the noise floor) against the ladder's FP8 rung of our stack
# (ladder.<scale>.float8_ours), same initial weights, same batches. A scale whose config has no
# convergence size has no job.
CONVERGENCE = config["convergence"][SCALE]


rule convergence_run:
    input:
        code=wf.code_inputs("lmperf.bench.convergence"),
    output:
        csv=report(f"{RESULTS}/convergence/convergence.csv", caption="captions/convergence.rst",
                   category="Results", subcategory="FP8 convergence"),
    log:
        f"{LOGS}/convergence.log",
    params:
        **PROVENANCE,
        spec=lambda w: wf.convergence_spec(config, SCALE),
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("convergence --spec {params.spec:q}")


rule convergence:
    input:
        [rules.convergence_run.output.csv] if "size" in CONVERGENCE else [],
