"""Context parallelism on CPU: activation memory per rank and step-time overhead, CP=1 vs CP=2.

    PYTHONPATH=. python benchmarks/context_parallel.py [--seq 4096] [--layers 2] [--steps 3]

A Gemma2 decoder of the tiny AudioLLM's width (hidden 128, 4 heads, 2 KV groups of 32,
window 64 on even layers) but of `--layers` layers and one row of `--seq` tokens, on
the reference attention (plain PyTorch, fp32: it materialises the [queries x keys]
scores, which is what CP divides). Each configuration runs under torchrun with one
thread per process: CP=1 in one process, CP=2 in two (gloo). Per rank:

  saved for backward  bytes of the tensors autograd keeps for the backward of one
                      forward (saved_tensors_hooks, each storage counted once): the
                      activation memory of the step, whatever the allocator does
  peak RSS growth     the process's peak resident memory during the steps minus before
  step time           median forward + backward of `--steps` timed steps (after one warm-up)
  gather time         time in the K/V all-gather and its backward's reduce-scatter, summed
                      (waiting for the slower rank included)

The overhead of CP is the extra core-seconds per step: 2 x (CP=2 step time) / (CP=1
step time) - 1 (two cores work on a step that one core did alone). Prints one table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.runtime.ports import free_port

REPO = Path(__file__).resolve().parents[1]


def worker(args) -> None:
    import resource

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from orchestrator.data.context_parallel import rank_slots
    from orchestrator.models.decoder_config import decoder_transformer_config
    from orchestrator.models.decoder_model import DecoderModel
    from orchestrator.plan.parallel_dims import ParallelDims
    from orchestrator.runtime.distributed import init_distributed, shutdown
    from orchestrator.plan.schema.model import DecoderConfig

    cp = int(os.environ["WORLD_SIZE"])
    init_distributed(ParallelDims(cp=cp), seed=0)
    dec = DecoderConfig(hidden_size=128, num_layers=args.layers, num_attention_heads=4, num_query_groups=2,
                        kv_channels=32, ffn_hidden_size=384, vocab_size=512, max_position_embeddings=args.seq,
                        sliding_window=64, query_pre_attn_scalar=32)
    model = DecoderModel(decoder_transformer_config(dec, ParallelDims(cp=cp)),
                        dec.vocab_size, dec.max_position_embeddings,
                        rope_theta=dec.rope_theta)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, dec.vocab_size, (1, args.seq), generator=gen)
    slots = rank_slots(args.seq // cp, cp, ps.get_context_parallel_rank()) if cp > 1 else torch.arange(args.seq)
    local, labels = tokens[:, slots], torch.roll(tokens, -1, dims=1)[:, slots]
    positions = slots[None]

    gather_time = [0.0]
    gather = tensor_parallel.gather_from_sequence_parallel_region

    class Timed(torch.autograd.Function):  # times the all-gather forward and its reduce-scatter backward
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            start = time.perf_counter()
            with torch.enable_grad():
                ctx.x = x.detach().requires_grad_()
                ctx.out = gather(ctx.x, group=group)
            gather_time[0] += time.perf_counter() - start
            return ctx.out.detach()

        @staticmethod
        def backward(ctx, grad):
            start = time.perf_counter()
            ctx.out.backward(grad)
            gather_time[0] += time.perf_counter() - start
            return ctx.x.grad, None

    tensor_parallel.gather_from_sequence_parallel_region = lambda x, group=None, **kw: Timed.apply(x, group)

    def step(measure: bool) -> int:
        saved = {}

        def pack(t):
            if measure:
                storage = t.untyped_storage()
                saved[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(local, positions, None, labels=labels).sum()
        loss.backward()
        model.zero_grad(set_to_none=True)
        return sum(saved.values())

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    saved_bytes = step(measure=True)  # also the warm-up
    gather_time[0] = 0.0
    times = []
    for _ in range(args.steps):
        dist.barrier()
        start = time.perf_counter()
        step(measure=False)
        times.append(time.perf_counter() - start)
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print("RESULT " + json.dumps({
        "cp": cp, "rank": dist.get_rank(), "saved_gib": saved_bytes / 2**30,
        "rss_growth_gib": (rss_peak - rss_before) / 2**20, "step_s": statistics.median(times),
        "gather_s": gather_time[0] / args.steps}), flush=True)
    shutdown()


def run(cp: int, args) -> list:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={cp}", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", __file__, "--worker", "--seq", str(args.seq), "--layers", str(args.layers),
           "--steps", str(args.steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    out = proc.stdout + proc.stderr
    if proc.returncode:
        sys.exit(f"CP={cp} failed:\n{out[-4000:]}")
    return sorted((json.loads(m) for m in re.findall(r"^RESULT (.*)$", out, re.M)), key=lambda r: r["rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seq % 4:
        sys.exit(f"--seq ({args.seq}) must be a multiple of 4 (2 x CP chunks at CP=2)")
    if args.worker:
        worker(args)
        return
    results = {cp: run(cp, args) for cp in (1, 2)}
    print(f"Gemma2 decoder, hidden 128, {args.layers} layers, one row of {args.seq} tokens, fp32, reference "
          f"attention, one thread per process")
    print(f"{'CP':>3} {'rank':>4} {'tokens':>7} {'saved for backward GiB':>23} {'peak RSS growth GiB':>20} "
          f"{'step s':>7} {'gather s':>9}")
    for cp, rows in results.items():
        for r in rows:
            print(f"{cp:>3} {r['rank']:>4} {args.seq // cp:>7} {r['saved_gib']:>23.3f} {r['rss_growth_gib']:>20.3f} "
                  f"{r['step_s']:>7.3f} {r['gather_s']:>9.3f}")
    one, two = results[1][0], max(results[2], key=lambda r: r["step_s"])
    print(f"activation memory per rank at CP=2: {max(r['saved_gib'] for r in results[2]) / one['saved_gib']:.2f} x CP=1's")
    print(f"step time at CP=2: {two['step_s'] / one['step_s']:.2f} x CP=1's; overhead in core-seconds per step: "
          f"{2 * two['step_s'] / one['step_s'] - 1:+.0%} (of which K/V gather and reduce-scatter "
          f"{two['gather_s'] / two['step_s']:.1%} of the CP=2 step)")


if __name__ == "__main__":
    main()
