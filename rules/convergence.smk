# The FP8 rung's convergence: the loss of every step on one fixed token stream, bf16 (twice: the
# second on another draw of the stream, the noise floor) against the ladder's FP8 rung of our stack
# (ladder.<scale>.float8_ours), same initial weights, same batches. A scale whose config has no
# convergence size has no job. The deep target's, as the repeats (rules/repeats.smk).


rule convergence_run:
    input:
        code=wf.code_inputs("lmperf.bench.convergence"),
    output:
        csv=report(wf.output(RESULTS, "convergence_run"), caption="captions/convergence.rst",
                   category="Results", subcategory="FP8 convergence"),
    log:
        f"{LOGS}/convergence.log",
    params:
        **PROVENANCE,
        spec=lambda w, output: wf.spec_of(RESULT_FILES, output.csv),
    resources:
        gpu=1,
        **cluster.job(SCALE),
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("convergence --spec {params.spec:q}")


rule convergence:
    input:
        wf.paths(RESULT_FILES, "convergence"),
