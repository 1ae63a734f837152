# FlashAttention-2: correctness against float64, then speed against PyTorch's attention.
FA = config["flash_attention"][SCALE]
FA_BENCH_JOBS = list(wf.fa_bench_jobs(FA, config["models"]))
FA_KERNELS = ["src/lmperf/kernels/flash_attention_triton.py",
              "src/lmperf/kernels/flash_attention_torch.py",
              "src/lmperf/kernels/attention_contract.py"]


rule flash_attention_check:
    input:
        kernels=FA_KERNELS,
        code=["src/lmperf/bench/flash_attention.py", *HARNESS],
    output:
        csv=f"{RESULTS}/flash_attention/check.csv",
    log:
        f"{LOGS}/flash_attention/check.log",
    params:
        **PROVENANCE,
        spec=wf.fa_check_spec(FA),
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("flash_attention check --spec {params.spec:q}")


rule flash_attention_bench:
    input:
        kernels=FA_KERNELS,
        model=["src/lmperf/model.py", "src/lmperf/ranges.py"],
        code=["src/lmperf/bench/flash_attention.py", *HARNESS],
    output:
        csv=f"{RESULTS}/flash_attention/bench/{{job}}.csv",
    log:
        f"{LOGS}/flash_attention/bench/{{job}}.log",
    params:
        **PROVENANCE,
        spec=lambda w: wf.fa_bench_spec(FA, config["models"], w.job),
    wildcard_constraints:
        job="|".join(FA_BENCH_JOBS),
    resources:
        gpu=1,
    conda:
        "../envs/lmperf.yaml"
    shell:
        wf.bench("flash_attention bench --spec {params.spec:q}")


rule flash_attention:
    input:
        rules.flash_attention_check.output.csv,
        expand(rules.flash_attention_bench.output.csv, job=FA_BENCH_JOBS),
