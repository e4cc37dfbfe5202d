"""How fast the tiny AudioLLM learns to transcribe the demo corpus on CPU: held-out WER
over training wall time.

    audiollm data demo /tmp/demo --num-samples 3000
    AUDIOLLM_DEMO_DATA=/tmp/demo PYTHONPATH=. python benchmarks/demo_learning.py \
        --minutes 10 --eval-every 60 [hydra overrides, e.g. optim.lr=2e-3 model.spec_augment.enabled=false]

Single process on CPU with the project's real parts: the tiny_cpu recipe's config
(compose), build_audiollm, build_train_loader / build_validation_loaders over the demo
corpus, megatron DDP + get_megatron_optimizer + OptimizerParamScheduler (linear warmup,
cosine decay over the planned steps), megatron's forward-backward schedule, the job's
TransformerConfig from the recipe's Plan. The loss of a step is the mean over its trained
tokens, as the trainer's (summed per micro-batch, divided by the step's token count).

Training runs for `--minutes` of training wall time or `train.iters` steps, whichever
comes first; the lr schedule spans `train.iters`. Every `--eval-every` seconds of
training (and at the end) it stops the clock, decodes the held-out validation sets
greedily and prints a row: training time, step, train loss (mean since the last row),
held-out loss, WER per validation set and pooled. Evaluation time is not counted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _setup_env() -> None:
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))


@torch.no_grad()
def heldout_loss(provider, model, validation, max_batches: int) -> float:
    was = model.training
    model.eval()
    total = count = 0.0
    for loader in validation.values():
        for k, batch in enumerate(loader):
            if k >= max_batches:
                break
            loss = provider.forward(model, batch)
            mask = batch["loss_mask"].reshape(-1)
            total += float((loss.reshape(-1) * mask).sum())
            count += float(mask.sum())
    model.train(was)
    return total / max(count, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="training wall time (eval excluded)")
    parser.add_argument("--eval-every", type=float, default=60.0, help="seconds of training between evaluations")
    parser.add_argument("--eval-samples", type=int, default=100, help="utterances per validation set")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("overrides", nargs="*", help="hydra overrides on the tiny_cpu recipe")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    _setup_env()
    from orchestrator.plan.compose import compose
    from orchestrator.plan.parallel_dims import ParallelDims
    from orchestrator.runtime.distributed import init_distributed, shutdown

    cfg = compose(["+recipe=tiny_cpu", *args.overrides])
    seed = int(cfg.train.seed)
    init_distributed(ParallelDims(tp=1), seed=seed)

    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from orchestrator.data.loader import build_train_loader, build_validation_loaders
    from orchestrator.data.tokenizer_build import load_tokenizer
    from orchestrator.scoring.asr import evaluate_generation
    from orchestrator.models.audiollm import build_audiollm

    data_cfg = cfg.data
    tokenizer = load_tokenizer(data_cfg.tokenizer)
    optim_cfg = cfg.optim
    mbs, gbs = int(optim_cfg.micro_batch_size), int(optim_cfg.global_batch_size)
    if gbs % mbs:
        raise ValueError(f"optim.global_batch_size ({gbs}) must be a multiple of optim.micro_batch_size ({mbs})")
    loader = build_train_loader(data_cfg, cfg.model.encoder, cfg.model.adapter, mbs, seed=int(data_cfg.seed))
    validation = build_validation_loaders(
        data_cfg, cfg.model.encoder, cfg.model.adapter, mbs)
    audio_id = loader.processor.audio_token_id

    from orchestrator.plan.resolve import resolve
    from orchestrator.train.audiollm_provider import AudioLLMProvider
    from orchestrator.train.megatron_config import transformer_config

    plan = resolve(cfg)
    provider = AudioLLMProvider.from_plan(plan)
    # The job's config (its per-token loss normalisation included: loss_func below).
    config = transformer_config(plan, on_gpu=False)
    model = build_audiollm(cfg.model, config, audio_token_id=audio_id)
    n_params = sum(p.numel() for p in model.parameters())
    config = model.config
    model = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(), module=model)
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=float(optim_cfg.lr), min_lr=float(optim_cfg.min_lr),
        weight_decay=float(optim_cfg.weight_decay), adam_beta1=float(optim_cfg.adam_beta1),
        adam_beta2=float(optim_cfg.adam_beta2), adam_eps=float(optim_cfg.adam_eps),
        clip_grad=float(optim_cfg.clip_grad)), [model])
    iters = int(cfg.train.iters)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=float(optim_cfg.lr), min_lr=float(optim_cfg.min_lr),
        lr_warmup_steps=int(optim_cfg.lr_warmup_iters), lr_decay_steps=iters,
        lr_decay_style=str(optim_cfg.lr_decay_style), start_wd=float(optim_cfg.weight_decay),
        end_wd=float(optim_cfg.weight_decay), wd_incr_steps=iters, wd_incr_style="constant")
    forward_backward = get_forward_backward_func()

    def forward_step(data_iterator, module):
        batch = next(data_iterator)
        out = provider.forward(module, batch)  # the trainer's forward: per-token loss [B, S] (+ CTC term)
        mask = batch["loss_mask"]

        def loss_func(per_token):  # the trainer's: summed over the tokens, megatron divides by their count
            mask_flat = mask.reshape(-1).to(per_token.dtype)
            num_tokens = mask_flat.sum().to(torch.int)
            loss_sum = (per_token.reshape(-1) * mask_flat).sum()
            return loss_sum, num_tokens, {"loss": loss_sum.detach() / num_tokens.clamp(min=1)}
        return out, loss_func

    # Decoding batches of 32 clips (the forward cost per step is small; fewer, larger batches win).
    val_for_wer = build_validation_loaders(data_cfg, cfg.model.encoder, cfg.model.adapter, 32)

    print(f"# tiny AudioLLM: {n_params / 1e6:.2f} M parameters; mbs {mbs}, gbs {gbs}, lr {optim_cfg.lr}, "
          f"warmup {optim_cfg.lr_warmup_iters}, iters {iters}, spec_augment "
          f"{cfg.model.spec_augment.enabled}; threads {args.threads}; load avg {os.getloadavg()[0]:.2f}; "
          f"init_std {cfg.model.decoder.init_method_std}; overrides {args.overrides}", flush=True)
    header = f"{'train_s':>8} {'step':>5} {'train_loss':>10} {'val_loss':>8} " + " ".join(
        f"{n[:22]:>22}" for n in val_for_wer) + f" {'wer_all':>8} {'eval_s':>6} {'load':>5}"
    print(header, flush=True)
    rows = []
    train_s = 0.0
    step = 0
    losses = []
    next_eval = args.eval_every
    budget = args.minutes * 60.0
    model.train()

    def evaluate():
        started = time.perf_counter()
        inner = model.module
        report = evaluate_generation(inner, val_for_wer, tokenizer, max_new_tokens=40,
                                     max_batches=math.ceil(args.eval_samples / 32), examples=2)
        vloss = heldout_loss(provider, inner, validation, max_batches=2)
        tl = sum(losses) / len(losses) if losses else float("nan")
        losses.clear()
        row = {"train_s": round(train_s, 1), "step": step, "train_loss": tl, "val_loss": vloss,
               "score": {k: v[v["metric"]] for k, v in report.items()}, "eval_s": time.perf_counter() - started,
               "load": os.getloadavg()[0],
               "examples": {k: v.get("examples") for k, v in report.items() if k != "all"}}
        rows.append(row)
        print(f"{row['train_s']:>8.0f} {step:>5} {tl:>10.3f} {vloss:>8.3f} " + " ".join(
            f"{report[n][report[n]['metric']]:>22.3f}" for n in val_for_wer) +
              f" {report['all']['wer']:>8.3f} {row['eval_s']:>6.0f} {row['load']:>5.2f}", flush=True)
        model.train()

    step_times = []
    while step < iters and train_s < budget:
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        batches = [next(loader) for _ in range(gbs // mbs)]
        out = forward_backward(forward_step_func=forward_step, data_iterator=iter(batches), model=model,
                               num_microbatches=len(batches), seq_length=int(data_cfg.seq_length),
                               micro_batch_size=mbs, forward_only=False)
        optimizer.step()
        scheduler.step(increment=1)
        step += 1
        losses.append(sum(float(o["loss"]) for o in out) / len(out))
        dt = time.perf_counter() - t0
        step_times.append(dt)
        train_s += dt
        if step % int(cfg.train.log_interval) == 0:
            print(f"#   step {step} loss {losses[-1]:.3f} step_s {dt:.2f} lr {scheduler.get_lr(optimizer.param_groups[0]):.2e}",
                  flush=True)
        if train_s >= next_eval:
            evaluate()
            next_eval += args.eval_every
    evaluate()
    final = rows[-1]
    print(f"# steps {step}; step time median {sorted(step_times)[len(step_times) // 2]:.2f} s; "
          f"final WER {final['score']['all']:.3f}; train loss {final['train_loss']:.3f}; "
          f"held-out loss {final['val_loss']:.3f}", flush=True)
    for name, ex in final["examples"].items():
        for ref, hyp in ex or []:
            print(f"#   {name}: ref {ref!r} hyp {hyp!r}")
    if args.json:
        Path(args.json).write_text(json.dumps({"overrides": args.overrides, "rows": rows}, indent=1) + "\n")
    shutdown()


if __name__ == "__main__":
    main()
