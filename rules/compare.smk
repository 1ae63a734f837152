# Two results folders compared row by row (python -m lmperf.compare): on one GPU a regression
# check of results/<b> against results/<a>, across two GPUs a hardware comparison. Asked for by
# name, e.g. snakemake --cores 1 report/compare/h200_vs_h100-80gb-hbm3.md
import importlib


rule compare:
    input:
        # lmperf.compare (pandas) is imported only when a page is asked for, not while planning
        a=lambda w: importlib.import_module("lmperf.compare").result_csvs(f"results/{w.a}"),
        b=lambda w: importlib.import_module("lmperf.compare").result_csvs(f"results/{w.b}"),
        code=wf.code_inputs("lmperf.compare"),
    output:
        # (the headline ratios' chart, report/compare/{a}_vs_{b}.png, is written beside it where
        # the two runs share headline rows)
        page="report/compare/{a}_vs_{b}.md",
    log:
        "logs/compare/{a}_vs_{b}.log",
    params:
        a="results/{a}",
        b="results/{b}",
        host_bound_pct=config["report"]["host_bound_idle_pct"],
    resources:
        **cluster.job(SCALE, "report"),  # no GPU
    wildcard_constraints:
        a=r"[^/]+",
        b=r"[^/]+",
    conda:
        "../envs/lmperf.yaml"
    shell:
        # --exit-zero: the page is the product; its summary says whether the check passed
        ("python -m lmperf.compare {params.a} {params.b} --out {output.page} --exit-zero "
         "--host-bound-pct {params.host_bound_pct} > {log} 2>&1")
