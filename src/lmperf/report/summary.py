"""The summary the report opens with: the answers a reader comes for, one row each, taken from
the claims (lmperf.report.claims) and the sections' views (nothing is computed twice) with what
each is read against: a peer measured at the same settings in the same run (a speed-up, its
noise band and verdict), or a published number (config/references.yaml, matched to the results
folder's GPU), shown beside ours with both settings and no ratio. templates/summary.md.j2 writes the rows, each linking
to the section it comes from; an answer that could not be measured here says why."""
from __future__ import annotations

import math

import pandas as pd

from lmperf import providers
from lmperf.report import claims, ladder_fp8, references as published
from lmperf.report.distributed_rows import GPU_WORDS
from lmperf.report.format import ratio_range, unavailable


# The published numbers the summary quotes, by id in config/references.yaml, with the short name
# it gives them (their sections show them in full, with sources and conditions).
QUOTED = {"cs336_leaderboard_record": "the CS336 leaderboard's record",
          "fa3_paper_h100_forward_d128_8k_fa3": "FlashAttention-3 (its paper, 2 x 16 heads)",
          "fa3_paper_h100_forward_d128_8k_cudnn": "cuDNN in the same paper",
          "llmc_gpt2_1558m_h100_mfu": "llm.c, the xl's shape on 8 GPUs",
          "torchtitan_llama31_8b_h100_mfu": "torchtitan, Llama 3.1 8B on 8 GPUs"}


def quoted(refs: dict, *ids: str) -> list[dict]:
    """The matching published entries among `ids`, each with its short name (`QUOTED`)."""
    return [{**refs[i], "short": QUOTED[i]} for i in ids if i in refs]


def view(views: dict, references: list[dict], hw: str, table: claims.Claims | None = None) -> dict:
    """{answer: its numbers, or unavailable(why)} from the sections' views ({section: view}) and
    the claims (lmperf.report.claims: every comparison the summary states is one of them)."""
    refs = published.matching(references, hw)
    get = lambda name: views.get(name) or unavailable(f"the {name} section is not rendered here")
    return {"flash_attention": flash_attention(get("flash_attention"), refs, table),
            "throughput": throughput(get("flash_attention"), refs, table),
            "training": training(get("ladder"), refs, views.get("convergence"), table),
            "lrpe": lrpe(get("lrpe")),
            "scaling": scaling(get("distributed")),
            "memory": memory(get("memory")),
            "profile": profile(get("profile")),
            "correctness": correctness(get("correctness")),
            "contenders": (views.get("contenders") or {}).get("summary", []),
            "reproducibility": reproducibility(get("repeats"))}


FA = "flash_attention/{group}/bf16/{causal}/{d}/{harness}/do_bench/"


def claim_row(table: claims.Claims, prefix: str, peer: str | None = None) -> dict | None:
    """The claim of the configuration `prefix` (claims.Claim.id up to the peer) against `peer`
    (a provider), else against its best peer; None where no claim has that prefix."""
    at = [c for c in table.claims if c.id.startswith(prefix)]
    if peer is not None:
        at = [c for c in at if c.peer is not None and c.peer.provider == peer]
    best = table.best(at)
    return None if best is None else {"claim": best, "shape": best.setting("shape"), "causal": best.setting("causal")}


def flash_attention(v: dict, refs: dict, table: claims.Claims | None = None) -> dict:
    """The headline configuration's forward+backward (causal): under the leaderboard's harness
    (the CS336 leaderboard's call) against its best peer timed in that harness, and called as it
    is against its best peer called as it is and each peer of record (lmperf.providers.of_record,
    `vs`: {peer: its row}; same run); the leaderboard's record beside it (published, other
    settings: no ratio). Every number is a claim's."""
    if not v["available"]:
        return unavailable(v["why"])
    if table is None:
        return unavailable("no claims computed")
    leader = claim_row(table, FA.format(group="headline", causal="causal", d="fwd_bwd", harness="leaderboard"))
    eager = FA.format(group="headline", causal="causal", d="fwd_bwd", harness="eager")
    rows = {"leaderboard": leader, "best": claim_row(table, eager),
            "vs": {p.name: claim_row(table, eager, p.name) for p in providers.of_record()}}
    if not (leader or rows["best"] or any(rows["vs"].values())):
        return unavailable("no headline configuration in the benchmark's rows")
    record = [r for r in claims.references(table, refs) if r["id"] == "cs336_leaderboard_record"]
    return {"available": True, **rows, "record": [{**r, "short": QUOTED[r["id"]]} for r in record]}


def throughput(v: dict, refs: dict, table: claims.Claims | None = None) -> dict:
    """The throughput configuration (non-causal): the forward's TFLOP/s against the best peer's,
    each peer of record's (`vs`, same run), its forward+backward against the best peer, and FlashAttention-3's and
    cuDNN's forward in the FlashAttention-3 paper beside it (published, other settings: no ratio)."""
    if not v["available"]:
        return unavailable(v["why"])
    if table is None:
        return unavailable("no claims computed")
    forward = FA.format(group="throughput", causal="full", d="forward", harness="eager")
    rows = {"best": claim_row(table, forward),
            "vs": {p.name: claim_row(table, forward, p.name) for p in providers.of_record()},
            "fwd_bwd": claim_row(table, FA.format(group="throughput", causal="full", d="fwd_bwd", harness="eager"))}
    if not (rows["best"] or rows["fwd_bwd"] or any(rows["vs"].values())):
        return unavailable("no non-causal throughput configuration in the benchmark's rows")
    published = [{**r, "short": QUOTED[r["id"]]} for r in claims.references(table, refs)
                 if r["id"].startswith("fa3_paper")]
    return {"available": True, **rows, "published": published}


def training(v: dict, refs: dict, convergence: dict | None = None, table: claims.Claims | None = None) -> dict:
    """The ladder's best bf16 rung's MFU (claims.mfu: causal attention's computed half, the full
    square beside it, as the published MFU of llm.c and torchtitan count), the claims of our best
    rung against the assignment's setting at the same context and of our FP8 rung against our best
    bf16 rung (the convergence section's verdict on its loss beside it)."""
    if not v["available"]:
        return unavailable(v["why"])
    mfu = table.mfu if table is not None else None
    if mfu is None or not math.isfinite(mfu["causal_half"]["mfu"]):
        return unavailable("no MFU in the ladder's rows (no peak rate known for this device)")
    ladder = [c for c in table.claims if c.section == "ladder"]
    assignment = next((c for c in ladder if c.setting("peer") == "the assignment's setting"), None)
    fp8 = next((c for c in ladder if c.setting("peer") == "our best bf16 rung"), None)
    size = next((c.setting("size") for c in ladder), "")
    return {"available": True, "size": size, "mfu": mfu, "assignment": assignment,
            "fp8": None if fp8 is None else {
                "claim": fp8, "how": ladder_fp8.how(fp8.ours.rung_name) if fp8.ours.rung_name else "",
                "convergence": ({"verdict": convergence["verdict"], "steps": int(convergence["table"]["steps"].max()),
                                 "result": {True: "within tolerance", False: "beyond tolerance"}.get(
                                     convergence.get("passed"), "not judged")}
                                if convergence and convergence.get("available") else None)},
            "published": quoted(refs, "llmc_gpt2_1558m_h100_mfu", "torchtitan_llama31_8b_h100_mfu")}


def lrpe(v: dict) -> dict:
    """Our LRPE kernel's worst share of the device's copy bandwidth over the large configs, per
    direction, on the bars' timing, against the copy bandwidth measured in the same run."""
    if not v["available"]:
        return unavailable(v["why"])
    a = v["answer"]
    if "forward" not in a and "backward" not in a:
        return unavailable("no configuration at or above the bars' size in the benchmark's rows")
    return {"available": True, **a, "copy_gbs": v["copy_gbs"]}


def scaling(v: dict) -> dict:
    """Per GPU count: DDP's tokens/s over one GPU's (the best variant, range over the model
    sizes, and the machine folder it comes from); FSDP2's peak memory per rank over DDP's at the
    largest count (range over the sizes, per tokens a GPU): this machine's multi-GPU runs, else
    another machine's (the one with the most GPUs), named, with the link to its section."""
    machine, link = "", None
    answers = v.get("answers", [])
    if not v["available"]:
        # the other machine with the most GPUs (its section has every count up to them)
        other = max((o for o in v.get("others", []) if o["answers"]), default=None,
                    key=lambda o: max(a.get("gpus", 2) for a in o["answers"]))
        if other is None:
            return unavailable(v["why"])
        machine, link, answers = other["machine"], other["link"], other["answers"]
    if not answers:
        return unavailable("no data-parallel training step on 2 or more GPUs in the section's rows")
    gpus = sorted({a.get("gpus", 2) for a in answers})
    counts = [{"gpus": n, **{k: at[0].get(k, v) for k, v in GPU_WORDS.items()},  # "GPUs", or a CPU's "processes"
               "sizes": list(dict.fromkeys(a["size"] for a in at)),
               "labels": list(dict.fromkeys(a.get("label", "DDP") for a in at)),
               "machine": ", ".join(dict.fromkeys(a["machine"] for a in at if a.get("machine"))),
               "speedup": ratio_range_of([a["speedup"] for a in at]),
               "slow_baseline": any(a.get("slow_baseline") for a in at),
               "host_bound": any(a.get("host_bound") for a in at), "accumulated": accumulated(at),
               "older": any(a.get("older") for a in at)}  # its machine folder's code changed since (freshness)
              for n in gpus if (at := [a for a in answers if a.get("gpus", 2) == n])]
    widest = [a for a in answers if a.get("gpus", 2) == gpus[-1]]
    tokens = list(dict.fromkeys(f["tokens"] for a in widest for f in a["fsdp"]))
    fsdp = [{"tokens": t, **ratio_range_of([f["ratio"] for a in widest for f in a["fsdp"] if f["tokens"] == t])}
            for t in tokens]
    return {"available": True, "machine": machine, "link": link, "sizes": [a["size"] for a in answers],
            "gpus": gpus, "counts": counts, "fsdp_gpus": gpus[-1],
            "speedup": ratio_range_of([a["speedup"] for a in answers]),
            "fsdp": [f for f in fsdp if f["n"]],  # none where peak memory is not measured (a CPU)
            "older": any(c["older"] for c in counts)}


def accumulated(at: list[dict]) -> dict | None:
    """DDP with more micro-batches a step at one GPU count (range over the model sizes), or None."""
    acc = [a["accumulated"] for a in at if a.get("accumulated")]
    if not acc:
        return None
    return {"micro_batches": acc[0]["micro_batches"], "tokens": acc[0]["tokens"],
            "speedup": ratio_range_of([a["speedup"] for a in acc]),
            "slow_baseline": any(a["slow_baseline"] for a in acc), "host_bound": any(a["host_bound"] for a in acc)}


def ratio_range_of(values: list[float]) -> dict:
    return ratio_range(pd.Series(values, dtype=float))


def memory(v: dict) -> dict:
    """The training step's peak (range over its cases) and the parameters' fp32 state beside it."""
    if not v["available"]:
        return unavailable(v["why"])
    p = v["peaks"]
    if "train" not in p or not p["train"]["n"]:
        return unavailable("no training step in the memory section's rows")
    state = p.get("model_state_mib")
    return {"available": True, "size": v["size"], **p,
            "vs_state": p["train"]["max"] / state if state else None}  # the largest peak over the model's state


def profile(v: dict) -> dict:
    """The matmul share of the forward and backward kernel time under bf16 autocast (eager),
    against fp32's, from the profiled cases."""
    if not v["available"]:
        return unavailable(v["why"])
    t = v["takeaway"]
    if "bf16" not in t or not t["bf16"]["matmul"]["n"]:
        return unavailable("no bf16 case in the profile's rows")
    return {"available": True, "on_gpu": v["on_gpu"], "bf16": t["bf16"], "fp32": t.get("fp32")}


def correctness(v: dict) -> dict:
    """How many checks passed against float64, and the worst error as a share of its tolerance."""
    if not v["available"] or not v["n_checks"]:
        return unavailable("no kernel-test results")
    return {"available": True, **{k: v[k] for k in ("n_checks", "n_passed", "n_kernels", "worst_ratio", "n_skipped")}}


def reproducibility(v: dict) -> dict:
    """Whether a rerun gives these numbers: the headline jobs on a fresh machine (how many timing
    rows agree within noise, host-bound ones apart) and the headline cases in fresh processes
    (their medians' spread against one process's)."""
    fresh = v.get("fresh_machine")
    if not v["available"] and not fresh:
        return unavailable(v["why"])
    across = {k: v[k] for k in ("numbers", "processes", "across_median_pct", "within_median_pct", "by_section")} \
        if v["available"] else None
    return {"available": True, "fresh": fresh, "across": across}
