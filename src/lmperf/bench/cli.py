"""The command line of every benchmark module (`python -m lmperf.bench.<x>`): its options
parsed and checked, the environment checked against the one the workflow planned with, and the
wait for the device, all before anything is measured."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable, Iterable

from lmperf import hardware
from lmperf.bench import device
from lmperf.bench.loop import Progress


def check_environment(args) -> None:
    """Refuse to measure in an environment other than the one the workflow planned with: the
    library versions it passed, and a CUDA device whenever the results folder is a GPU's."""
    versions = hardware.library_versions()
    for lib in ("torch", "triton"):
        expected = getattr(args, f"expect_{lib}", None)
        if expected is not None and versions[lib] != expected:
            sys.exit(f"error: the workflow planned with {lib} {expected}, but this process "
                     f"imports {lib} {versions[lib]}; run snakemake from the same environment")
    if args.hw != "cpu":
        import torch
        if not torch.cuda.is_available():
            sys.exit(f"error: --hw {args.hw} names a GPU, but torch {torch.__version__} sees no "
                     f"CUDA device (a CPU-only torch build?); results would be mislabelled")
    import torch
    if not torch.cuda.is_available():  # Triton kernels run in its interpreter; set before import
        os.environ.setdefault("TRITON_INTERPRET", "1")


def base_parser(description: str, add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, add_help=add_help)
    p.add_argument("--out", type=Path, required=True, help="CSV to write")
    p.add_argument("--hw", required=True, help="hardware name for the results folder and rows")
    p.add_argument("--log", type=Path, help="also append progress lines to this file")
    p.add_argument("--expect-torch", help="fail unless this torch version is the one imported")
    p.add_argument("--expect-triton", help="fail unless this triton version is the one imported")
    return p


def bench_args(doc: str, argv=None, *, studies: Iterable[str] = (), spec: bool = True, size: bool = False,
               options: Callable[[argparse.ArgumentParser], None] | None = None,
               shares_device: bool | Callable[[argparse.Namespace], bool] = lambda args: getattr(args, "study", None) == "check",
               warms: bool = False) -> argparse.Namespace:
    """The command line of every bench module, parsed and checked: base_parser's options,
    `--spec` (the grid as JSON, parsed into args.spec; not with spec=False), with size=True
    `--size` (one model size a call: a key of the spec's `models`), and what `options(parser)`
    adds; with `studies`, each is a subcommand (`python -m lmperf.bench.lrpe check ...`, named by
    args.study). Then check_environment, before anything is measured, and the wait for the device
    (bench/device.py): beside other checks where `shares_device` (by default, the study `check`);
    for a job that `warms` its compiles in workers (`--workers` above 1: bench/jobs.py), beside
    them until jobs.run has warmed them; else alone."""
    def add(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        if spec:
            p.add_argument("--spec", required=True, type=_json, help="the grid as JSON (see config/sections/)")
        if size:
            p.add_argument("--size", required=True, help="model size: one of the spec's `models`")
        if options:
            options(p)
        return p

    if studies:
        top = argparse.ArgumentParser(description=doc.splitlines()[0])
        sub = top.add_subparsers(dest="study", required=True)
        for name in studies:
            add(sub.add_parser(name, parents=[base_parser(doc, add_help=False)]))
    else:
        top = add(base_parser(doc))
    args = top.parse_args(argv)
    if size and args.size not in args.spec["models"]:
        top.error(f"--size {args.size!r} is not among the spec's models {sorted(args.spec['models'])}")
    check_environment(args)
    shared = shares_device(args) if callable(shares_device) else shares_device
    progress = Progress(getattr(args, "study", None) or Path(sys.argv[0]).stem, 0, args.log)
    device.take(shared, say=progress.say, warming=warms and getattr(args, "workers", 1) > 1)
    progress.close()
    return args


def _json(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text[:80]!r}") from None
