"""Estimated vs measured peak memory of one training step of a recipe on this machine.

Builds the recipe's AudioLLM in one process (CPU, fp32, megatron DDP + optimizer), runs
`--steps` full-length micro-batches (every row holds the longest clip the data config
allows), and compares the growth of the process's resident memory from just before the
model is built to its peak with the plan's estimate (weights + grads + optimizer +
activations, without and with the stated margin). Resident memory also counts the
allocator's cached blocks, so the measurement is an upper bound of what tensors used.

Run: .venv/bin/python benchmarks/memory_estimate.py [--recipe tiny_cpu] [--steps 2] [overrides ...]
"""

import argparse
import os
import resource

import psutil

from orchestrator.runtime.ports import free_port


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", default="tiny_cpu")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))

    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import resolve, to_object

    cfg = compose([f"+recipe={args.recipe}", *args.overrides])
    plan = resolve(cfg)
    obj = to_object(cfg)
    if plan.dims.world_size != 1:
        raise SystemExit(f"this benchmark runs one process; the plan has world size {plan.dims.world_size}")

    import torch
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from orchestrator.plan.adapter_kinds import frames_per_token
    from orchestrator.plan.model_params import audio_token_count
    from orchestrator.models.audiollm import build_audiollm
    from orchestrator.runtime.distributed import init_distributed
    from orchestrator.train.megatron_config import transformer_config

    init_distributed(plan.dims, seed=1234)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    process = psutil.Process()
    baseline = process.memory_info().rss

    audio_token_id = 3
    model = build_audiollm(obj.model, transformer_config(plan, on_gpu=False), audio_token_id=audio_token_id)
    model = DistributedDataParallel(config=model.config, ddp_config=DistributedDataParallelConfig(), module=model)
    optimizer = get_megatron_optimizer(OptimizerConfig(lr=1e-4, clip_grad=1.0), [model])

    mbs, seq = obj.optim.micro_batch_size, obj.data.seq_length
    enc = obj.model.encoder
    window = 2 * enc.max_source_positions
    mel_frames = min(int(obj.data.max_audio_seconds * 100), window)
    n_audio = audio_token_count(mel_frames, frames_per_token(obj.model.adapter))
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(10, obj.model.decoder.vocab_size, (mbs, seq), generator=generator)
    tokens[:, 4:4 + n_audio] = audio_token_id
    positions = torch.arange(seq).expand(mbs, seq)
    features = torch.randn(mbs, enc.num_mel_bins, window, generator=generator)
    for _ in range(args.steps):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        loss = model(tokens, positions, None, labels=tokens, audio_features=features,
                     audio_lengths=[mel_frames] * mbs).float().mean()
        loss.backward()
        optimizer.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    measured = (peak - baseline) / 2**30
    mem = plan.memory
    subtotal = mem["weights_gib"] + mem["grads_gib"] + mem["optimizer_gib"] + mem["activations_gib"]
    print("| recipe | micro batch x seq | estimate w/o margin GiB | estimate GiB | measured peak growth GiB | error w/o margin | error |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.recipe} | {mbs} x {seq} | {subtotal:.3f} | {mem['total_gib']:.3f} | {measured:.3f} | "
          f"{(subtotal - measured) / measured:+.0%} | {(mem['total_gib'] - measured) / measured:+.0%} |")
    print(f"estimate parts (GiB): weights {mem['weights_gib']:.3f}, grads {mem['grads_gib']:.3f}, "
          f"optimizer {mem['optimizer_gib']:.3f}, activations {mem['activations_gib']:.3f}")


if __name__ == "__main__":
    main()
