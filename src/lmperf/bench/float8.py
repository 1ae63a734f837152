"""Float8 training as the ladder and the convergence check use it: torchao's conversion and its
recipes (the peers), our delayed scaling (kernels/float8_delayed.py), and the FP8 rung of our own
stack (config `ladder.<scale>.float8_ours`).

The FP8 rung is our stack's rung at one context (`float8_ours.context`: the base context or one of
`contexts`, the best bf16 rung's) plus float8 matmuls: every nn.Linear but the LM head multiplies
in fp8, in `float8_ours.recipe`: `delayed`, ours (scales from a 16-step amax history, one Triton
cast kernel that also writes the transposed copy and the amax, the input cast once for the layers
that read it, each SwiGLU's product and its gradients computed and cast in fp8 by one kernel
each), or torchao's `convert_to_float8_training` in one of its recipes; on top of our
FlashAttention, MasterWeightAdamW's bf16 weights and our fused kernels (whatever that rung
carries). It follows that rung directly and, like the float8 peers, is carried nowhere: the bf16
rungs stay bf16, so the best bf16 rung stays comparable. Its MFU is counted against the bf16
peak, as every rung's (the report gives the fp8 peak beside it).
"""
from __future__ import annotations

from lmperf import failures

RECIPES = ("tensorwise", "rowwise")  # torchao's, the peers
OURS_RECIPES = ("delayed", *RECIPES)  # what the FP8 rung of our stack may use
MISSING = "needs torchao (pip wheel; tools/wheelhouse.sh)"
OURS = "ours_float8"  # the FP8 rung's name: ours_float8_<recipe>


def training(recipe: str):
    """fn(model): float8 training in `recipe` on every nn.Linear but the LM head, in place (the
    layers keep their weight parameters, so an optimizer's stay valid): `delayed`, ours
    (kernels/float8_delayed.convert, on the model's device); else torchao's, NotRun where torchao
    cannot be imported (not installed, or built for another torch)."""
    if recipe == "delayed":
        from lmperf.kernels import float8_delayed
        return lambda model: float8_delayed.convert(model, skip=("lm_head",))
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except Exception as exc:  # noqa: BLE001
        raise failures.NotRun(f"{MISSING} ({type(exc).__name__})") from None
    config = Float8LinearConfig.from_recipe_name(recipe)
    return lambda model: convert_to_float8_training(model, config=config,
                                                    module_filter_fn=lambda module, fqn: fqn != "lm_head")


def ours(spec: dict) -> dict | None:
    """The ladder spec's `float8_ours` ({context, recipe}), checked against its contexts; None
    where the spec has none. ValueError naming the key."""
    fp8 = spec.get("float8_ours")
    if fp8 is None:
        return None
    contexts = [spec["context"], *spec["contexts"]]
    if fp8.get("context") not in contexts:
        raise ValueError(f"ladder float8_ours.context {fp8.get('context')}: the FP8 rung follows the rung at "
                         f"one of the ladder's contexts (context or contexts): {contexts}")
    if fp8.get("recipe") not in OURS_RECIPES:
        raise ValueError(f"ladder float8_ours.recipe {fp8.get('recipe')!r}: choose from {list(OURS_RECIPES)}")
    return fp8


def ours_rung(spec: dict, context: int) -> list[tuple]:
    """The ladder's step (name, change, keys it sets, needs CUDA) of the FP8 rung, where
    `float8_ours` names `context`: one step, or none."""
    fp8 = ours(spec)
    if fp8 is None or fp8["context"] != context:
        return []
    recipe = fp8["recipe"]
    how = "our delayed scaling (kernels/float8_delayed.py)" if recipe == "delayed" else \
        f"torchao float8 training, {recipe} scaling"
    return [(f"{OURS}_{recipe}", f"our stack in fp8: {how} (every nn.Linear but the LM head multiplies in fp8) on "
             f"the settings of the rung before (context {context:,}); not carried up: the rungs after stay bf16",
             {"float8": recipe}, True)]


def is_ours(name: str) -> bool:
    """Whether a ladder rung's name is the FP8 rung of our stack."""
    return name.startswith(OURS + "_")
