# FlashAttention-2: correctness against float64, then speed against PyTorch's attention.
FA = config["flash_attention"][SCALE]
FA_BENCH_JOBS = list(wf.fa_bench_jobs(FA, config["models"]))


rule flash_attention_check:
    input:
        code=wf.code_inputs("lmperf.bench.flash_attention") + wf.provider_inputs(config),
    output:
        csv=report(f"{RESULTS}/flash_attention/check.csv", caption="captions/flash_attention.rst",
                   category="Results", subcategory="FlashAttention-2", labels={"job": "check"}),
    log:
        f"{LOGS}/flash_attention/check.log",
    params:
        **PROVENANCE,
        spec=wf.fa_check_spec(FA, config),
        workers=wf.workers(FA["check"]),
    threads: wf.workers(FA["check"])  # its worker processes' CPU cores
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("flash_attention check --spec {params.spec:q} --workers {params.workers}")


rule flash_attention_bench:
    input:
        code=wf.code_inputs("lmperf.bench.flash_attention") + wf.provider_inputs(config),
    output:
        csv=report(f"{RESULTS}/flash_attention/bench/{{job}}.csv", caption="captions/flash_attention.rst",
                   category="Results", subcategory="FlashAttention-2", labels={"job": "{job}"}),
    log:
        f"{LOGS}/flash_attention/bench/{{job}}.log",
    params:
        **PROVENANCE,
        spec=lambda w: wf.fa_bench_spec(FA, config["models"], w.job, config),
        workers=wf.workers(FA["bench"]),
    wildcard_constraints:
        job="|".join(FA_BENCH_JOBS),
    threads: wf.workers(FA["bench"])  # its worker processes' CPU cores
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("flash_attention bench --spec {params.spec:q} --workers {params.workers}")


rule flash_attention:
    input:
        rules.flash_attention_check.output.csv,
        expand(rules.flash_attention_bench.output.csv, job=FA_BENCH_JOBS),
