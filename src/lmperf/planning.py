"""What can be known about a config before anything runs (rules/common.smk calls these while
Snakemake plans, the renderer when it reads a config): the cross-field checks the JSON schema
cannot express. Every model size a grid names exists, heads split d_model into an even head dim
(RoPE rotates pairs), our FlashAttention is run only at head dims its contract accepts, and
every provider a grid names is one of lmperf.providers' (after loading the config's
`provider_modules`). Each raises ValueError naming the key. Imports neither torch nor triton.
"""
from __future__ import annotations

import ast
from pathlib import Path

from lmperf import providers

ATTENTION_CONTRACT = Path(__file__).parent / "kernels" / "attention_contract.py"


def attention_head_dims() -> tuple[int, ...]:
    """The head dims our FlashAttention accepts (HEAD_DIM_MIN to HEAD_DIM_MAX in steps of
    HEAD_DIM_STEP), read from kernels/attention_contract.py's source: importing it imports torch."""
    names = {}
    for node in ast.parse(ATTENTION_CONTRACT.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = (zip(target.elts, value.elts) if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                     else [(target, value)])
            names.update({t.id: v.value for t, v in pairs if isinstance(t, ast.Name) and isinstance(v, ast.Constant)})
    try:
        return tuple(range(names["HEAD_DIM_MIN"], names["HEAD_DIM_MAX"] + 1, names["HEAD_DIM_STEP"]))
    except KeyError as missing:
        raise RuntimeError(f"{ATTENTION_CONTRACT} no longer sets {missing} to a number; "
                           "lmperf.planning.attention_head_dims reads the head dims from it") from None


def _check_models(config: dict) -> None:
    """Every model's heads split d_model evenly, into an even head dim (RoPE rotates pairs)."""
    for name, m in config["models"].items():
        if m["d_model"] % m["n_heads"]:
            raise ValueError(f"config: models.{name}: n_heads = {m['n_heads']} does not divide "
                             f"d_model = {m['d_model']}")
        if (m["d_model"] // m["n_heads"]) % 2:
            raise ValueError(f"config: models.{name}: head dim d_model / n_heads = "
                             f"{m['d_model'] // m['n_heads']} is odd; RoPE needs an even one")


def _check_attention_head_dims(config: dict) -> None:
    """Every head dim our FlashAttention is run at is one its contract accepts: the check
    shapes' last dim, the bench groups' head dims, and the head dims of the model sizes it runs
    inside (bench model groups, e2e studies with our attention or the ladder)."""
    dims = attention_head_dims()
    contract = f"our FlashAttention takes head dims {dims[0]}, {dims[1]}, ... {dims[-1]} ({ATTENTION_CONTRACT.name})"
    head_dim = lambda size: config["models"][size]["d_model"] // config["models"][size]["n_heads"]
    for scale, fa in config["flash_attention"].items():
        for key in ("shapes", "compiled_shapes"):
            bad = [s for s in fa["check"].get(key, []) if s[-1] not in dims]
            if bad:
                raise ValueError(f"config: flash_attention.{scale}.check.{key} has shapes {bad} whose "
                                 f"head dim (last entry) is not one {contract}")
        for group in fa["bench"]["groups"]:
            bad = [d for d in group.get("head_dims", []) if d not in dims]
            bad += [f"{m} ({head_dim(m)})" for m in group.get("models", []) if head_dim(m) not in dims]
            if bad:
                raise ValueError(f"config: flash_attention.{scale}.bench group {group['name']!r}: head "
                                 f"dims {bad} are not ones {contract}")
    for scale, e2e in config["e2e"].items():
        for study, spec in e2e.get("studies", {}).items():  # none where {run: false}
            if e2e_uses_our_attention(spec):
                bad = [f"{s} ({head_dim(s)})" for s in [*spec["sizes"], *spec.get("deep_sizes", [])]
                       if head_dim(s) not in dims]
                if bad:
                    raise ValueError(f"config: e2e.{scale}.studies.{study} runs our FlashAttention on "
                                     f"sizes {bad}, whose head dims are not ones {contract}")
    for scale, ladder in config["ladder"].items():  # its flash-triton rungs
        bad = [f"{s} ({head_dim(s)})" for s in ladder["sizes"] if head_dim(s) not in dims]
        if bad:
            raise ValueError(f"config: ladder.{scale}.sizes: the ladder runs our FlashAttention on sizes "
                             f"{bad}, whose head dims are not ones {contract}")


def _named_sizes(config: dict):
    """(key, the model sizes it names) for every entry of the config that names model sizes."""
    for scale, prof in config["profile"].items():
        yield f"profile.{scale}.cases", [c["size"] for c in prof["cases"]]
    for scale, mem in config["memory"].items():
        yield f"memory.{scale}.size", [mem["size"]]
    for scale, fa in config["flash_attention"].items():
        for group in fa["bench"]["groups"]:
            yield f"flash_attention.{scale}.bench group {group['name']!r}", group.get("models", [])
    for scale, e2e in config["e2e"].items():
        for study, spec in e2e.get("studies", {}).items():  # none where {run: false}
            yield f"e2e.{scale}.studies.{study}.sizes", spec["sizes"]
            yield f"e2e.{scale}.studies.{study}.deep_sizes", spec.get("deep_sizes", [])
    for scale, ladder in config["ladder"].items():
        yield f"ladder.{scale}.sizes", ladder["sizes"]
    for scale, adamw in config["adamw_master"].items():
        yield f"adamw_master.{scale}.check.sizes", adamw["check"]["sizes"] if "check" in adamw else []
    for scale, fused in config["fused"].items():
        yield f"fused.{scale}.check.model.sizes", fused["check"]["model"]["sizes"] if "check" in fused else []
    for scale, conv in config.get("convergence", {}).items():
        yield f"convergence.{scale}.size", [conv["size"]] if "size" in conv else []


def _check_sizes(config: dict, named) -> None:
    """Every (key, sizes) of `named` names model sizes of the config's `models`."""
    for key, sizes in named:
        unknown = [s for s in sizes if s not in config["models"]]
        if unknown:
            raise ValueError(f"config: {key} names {unknown}, which are not under models: "
                             f"{sorted(config['models'])}")


def _named_providers(config: dict):
    """(key, contract, the provider names it lists) for every entry of the config that names
    providers."""
    for scale, fa in config["flash_attention"].items():
        yield f"flash_attention.{scale}.check.impls", "attention", fa["check"]["impls"]
        for group in fa["bench"]["groups"]:
            key = f"flash_attention.{scale}.bench group {group['name']!r}"
            yield f"{key} providers", "attention", group["providers"]
            if isinstance(group.get("gpu_time"), list):
                yield f"{key} gpu_time", "attention", group["gpu_time"]
            yield f"{key} skip", "attention", [s["provider"] for s in group.get("skip", [])]
    for scale, ladder in config.get("ladder", {}).items():
        yield f"ladder.{scale}.fused", "fused", ladder.get("fused", [])
    for scale, lrpe in config.get("lrpe", {}).items():
        yield f"lrpe.{scale}.check.impls", "lrpe", lrpe["check"].get("impls", [])
        yield f"lrpe.{scale}.bench providers", "lrpe", lrpe["bench"].get("providers", [])


def _check_providers(config: dict) -> None:
    """Every provider the config names is registered (lmperf.providers), the modules of its
    `provider_modules` loaded first (a ValueError names one that does not import)."""
    providers.load_config(config)
    for key, contract, names in _named_providers(config):
        if unknown := providers.unknown(contract, names):
            raise ValueError(f"config: {key} names {unknown}, which are not {contract} providers; known: "
                             f"{', '.join(providers.names(contract))} (src/lmperf/providers.py, or a module "
                             f"of provider_modules)")


def check_config(config: dict) -> None:
    """Cross-field checks the JSON schema cannot express; raise ValueError naming the key. First
    reads the config in today's names (`in_todays_names`)."""
    in_todays_names(config)
    _check_providers(config)
    _check_sizes(config, _named_sizes(config))
    for scale, lrpe in config["lrpe"].items():
        for i, grid in enumerate(lrpe["check"]["grids"]):
            if len(grid["shape"]) * grid["e"] < grid["d"]:
                raise ValueError(f"config: lrpe.{scale}.check.grids[{i}]: m * e = "
                                 f"{len(grid['shape'])} * {grid['e']} < d = {grid['d']}")
    _check_models(config)
    _check_attention_head_dims(config)
    _check_float8(config)


def in_todays_names(config: dict) -> dict:
    """`config`, in place, with a renamed provider's old name in its case patterns (the ladder's
    `cases`, the repeats' `cases`) read as today's (`providers.renamed_id`): a config written
    before a rename selects the same cases, with no error. The case ids hold the model's
    attention's name (the ladder rung named after it)."""
    new = lambda patterns: [providers.renamed_id(p, "model_attention") for p in patterns]
    for ladder in config.get("ladder", {}).values():
        if "cases" in ladder:
            ladder["cases"] = new(ladder["cases"])
    for repeats in config.get("repeats", {}).values():
        for entry in (repeats or {}).get("jobs", []):
            entry["cases"] = new(entry["cases"])
    return config


def _check_float8(config: dict) -> None:
    """The ladder's FP8 rung follows the rung at one of its contexts, and a convergence job has an
    FP8 rung to train."""
    for scale, ladder in config["ladder"].items():
        fp8, contexts = ladder.get("float8_ours"), [ladder["context"], *ladder["contexts"]]
        if fp8 and fp8["context"] not in contexts:
            raise ValueError(f"config: ladder.{scale}.float8_ours.context = {fp8['context']}: the FP8 rung "
                             f"follows the rung at one of the ladder's contexts (context or contexts): {contexts}")
    for scale, conv in config.get("convergence", {}).items():
        if "size" in conv and not config["ladder"][scale].get("float8_ours"):
            raise ValueError(f"config: convergence.{scale} trains the ladder's FP8 rung, but ladder.{scale} "
                             f"has no float8_ours")


def e2e_uses_our_attention(spec: dict) -> bool:
    """Whether an e2e study's model runs our FlashAttention kernel: a study with our attention
    (lmperf.providers, contract "model_attention")."""
    return spec.get("attention") in providers.names("model_attention", "ours")


def check_distributed_config(config: dict) -> None:
    """The distributed section's sizes are model names (raise ValueError naming the key)."""
    _check_sizes(config, ((f"distributed.{scale}.ddp.sizes", config["distributed"][scale]["ddp"]["sizes"])
                          for scale in ("full", "smoke")))
