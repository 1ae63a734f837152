"""The best bf16 rung's forward and backward replayed as one CUDA graph (ladder NOTES section 7): a
one-off probe.

Section 5's profiled step (rung 15, 2.7B, 4 x 2,048) is 350.3 ms with 341.3 ms of kernels: about
9 ms a step in which the GPU runs no kernel (launches, Python between the blocks' compiled
graphs, autograd's bookkeeping). Captured once and replayed, the forward and backward launch
nothing from Python. The optimizer stays eager (MasterWeightAdamW synchronises on an event and
keeps its step count on the host, so it is not capturable as it is). In one process, on one
model, one after the other (the graph's memory pool stays once made):
  eager   train.step as the ladder runs it (forward, backward, optimizer, zero_grad)
  graph   the captured forward and backward replayed, then the optimizer's step
Gradients: captured with every .grad None, autograd gives each weight the gradient tensor the
graph writes; replays overwrite it in place (no zero_grad between replays). Prints each one's
step time (CUDA events; median and 20-80% quantiles) and the loss after the steps.

    PYTHONPATH=src:tuning/ladder python tuning/ladder/graph_step_probe.py [--steps 15]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="2.7B")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=15, help="timed steps of each way")
    args = ap.parse_args()
    import torch
    import yaml

    from lmperf import train
    from lmperf.bench import ladder
    if not torch.cuda.is_available():
        raise SystemExit("graph_step_probe: needs CUDA (it captures a CUDA graph)")
    from ladder_kernels import rung_case  # this folder's
    dims = yaml.safe_load(open("config/config.yaml"))["models"][args.size]
    case = rung_case(argparse.Namespace(optimizer="master", fused="rmsnorm+swiglu", float8="none",
                                        context=args.context, batch=args.batch))
    cfg, model, optimizer, inputs, targets, autocast = train.setup(case, dims)
    ladder.model_changes(case)(model)
    nothing = lambda phase: contextlib.nullcontext()
    for _ in range(3):  # compile and warm
        train.step(model, optimizer, inputs, targets, autocast, nothing)
    torch.cuda.synchronize()

    def fwd_bwd():
        with autocast:
            out = train.loss(model, inputs, targets)
        out.backward()
        return out

    def timed(fn, n):
        out = []
        for _ in range(n):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end))
        return out

    times = {"eager": timed(lambda: train.step(model, optimizer, inputs, targets, autocast, nothing), args.steps)}
    torch.cuda.empty_cache()  # the eager steps' blocks back before the graph's own pool is made
    side = torch.cuda.Stream()  # warm the captured work on a side stream, as torch.cuda.graphs asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            fwd_bwd()
    torch.cuda.current_stream().wait_stream(side)
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the warm-up's blocks too: the graph's pool holds a step's activations
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = fwd_bwd()
    torch.cuda.synchronize()
    print(f"captured: {sum(w.grad is not None for w in optimizer.weights)} of {len(optimizer.weights)} "
          f"Linear weights hold the graph's gradients; {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB peak",
          flush=True)

    def graph_step():
        graph.replay()
        optimizer.step()

    times["graph"] = timed(graph_step, args.steps)
    print(f"graph loss after its steps {float(static_loss):.4f}", flush=True)
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=5)
        print(f"{name:6s} step {statistics.median(ts):.1f} ms (q20 {q[0]:.1f}, q80 {q[3]:.1f}; n {len(ts)})", flush=True)


if __name__ == "__main__":
    main()
