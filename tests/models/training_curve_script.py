"""Training curves of each decoder family (gemma2, llama, qwen2, qwen3, gemma3) on CPU, fp32,
in one process launch:

- full fine-tuning of the project's decoder at TP=2 with sequence parallelism against a
  plain HF + torch loop on the HF model, from the same weights over the same batches, for
  FULL_PLAN's train.iters steps. Each side reads the recipe's optimizer keys on its own: the
  project through the job's code (megatron_config.optimizer_config, ddp_config,
  lr_scheduler, lr_groups, megatron's get_megatron_optimizer and the job's foreach
  kernels); the HF loop as torch.optim.AdamW over the recipe's values, the schedule written
  out here (linear warmup from 0, cosine to min_lr), no weight decay on biases and 1-D
  weights, the gradient norm clipped with torch's clip_grad_norm_;
- the known mistake the forward parity cannot see: qwen3 without megatron's qk_layernorm,
  whose QK-norm gradients then stay partial under TP (family_parity_script.py);
- LoRA (LORA_PLAN's lora section: its targets, rank, alpha and lr groups, the base frozen)
  at TP=2 with sequence parallelism against TP=1 (data-parallel 2 there, both ranks on the
  same batch), LORA_STEPS steps, then the adapted model's logits.

Prints one `CURVE <json>` line per run from rank 0.
Run: torchrun --nproc_per_node=2 tests/models/training_curve_script.py FULL_PLAN_DIR LORA_PLAN_DIR"""

from __future__ import annotations

import json
import math
import sys

import torch
import torch.distributed as dist

from tests.models.tiny_models import HF_DECODERS, decoder_config, hf_gemma2

BATCHES, BATCH, SEQ = 4, 2, 32  # cycled: the models learn them by heart
LORA_STEPS = 20


def batches(vocab: int, pad_id) -> list:
    """Token rows without the pad id: HF's embedding gives the pad row no gradient
    (nn.Embedding's padding_idx, Gemma's 0), megatron's gives it one. In the project's
    runs pads sit only in loss-masked padding, where that gradient is zero anyway; as a
    token of the text here it would part the curves from step 4 (the first repeat)."""
    gen = torch.Generator().manual_seed(7)
    rows = []
    for _ in range(BATCHES):
        tokens = torch.randint(0, vocab, (BATCH, SEQ), generator=gen)
        if pad_id is not None:
            tokens[tokens == pad_id] = (pad_id + 1) % vocab
        rows.append(tokens)
    return rows


def lr_at(step: int, optim: dict, steps: int, scale: float = 1.0) -> float:
    """The recipe's learning rate before optimizer step `step` (0-based), written out:
    linear warmup from 0 over lr_warmup_iters, then cosine to min_lr at `steps`; an lr
    group's `scale` multiplies both ends (orchestrator/train/lr_groups.py)."""
    lr, min_lr, warmup = float(optim["lr"]) * scale, float(optim["min_lr"]) * scale, int(optim["lr_warmup_iters"])
    if step <= warmup:
        return lr * step / warmup
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))


def hf_curve(hf, data: list, optim: dict, steps: int) -> list:
    """A plain training loop of the HF model with the recipe's optimizer values."""
    named = [(n, p) for n, p in hf.named_parameters() if p.requires_grad]
    decayed = [p for n, p in named if p.dim() > 1 and not n.endswith(".bias")]
    plain = [p for n, p in named if p.dim() <= 1 or n.endswith(".bias")]
    opt = torch.optim.AdamW([{"params": decayed, "weight_decay": float(optim["weight_decay"])},
                             {"params": plain, "weight_decay": 0.0}],
                            lr=float(optim["lr"]), betas=(float(optim["adam_beta1"]), float(optim["adam_beta2"])),
                            eps=float(optim["adam_eps"]))
    hf.train()
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, optim, steps)
        tokens = data[step % len(data)]
        loss = hf(tokens, labels=tokens).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in named], float(optim["clip_grad"]))
        opt.step()
        losses.append(loss.item())
    return losses


def project_curve(plan, full: dict, shape, dec, data: list, steps: int, tp: int, sp: bool, lora: bool = False,
                  **overrides) -> tuple:
    """(losses, the unwrapped model) of the project's decoder trained through the job's
    optimizer, schedule and learning-rate groups of `plan`; LoRA from plan's lora section."""
    from megatron.core.optimizer import get_megatron_optimizer

    from orchestrator.train import lr_groups as lrg
    from orchestrator.train import megatron_config as mcfg
    from orchestrator.train import optimizer_kernels
    from orchestrator.train.lora import apply_lora
    from tests.models.norm_grads import decoder_under_ddp, forward_backward

    lora_cfg = plan.section("lora")
    # The job's groups name the AudioLLM's parts; the decoder here is the whole model.
    groups = [{**g, "patterns": [p.removeprefix("language_model.") for p in g["patterns"]]}
              for g in lrg.plan_groups(lora_cfg)]
    ocfg = mcfg.optimizer_config(plan, on_gpu=False)

    def prepare(module):  # what the Trainer does to the chunks before DDP wraps them
        if lora:
            apply_lora(module, lora_cfg, plan.seed)
        return lrg.apply_lr_groups([module], groups, ocfg.lr, ocfg.min_lr)[0]

    model, group_overrides = decoder_under_ddp(full, shape, dec, tp, sp, ddp_config=mcfg.ddp_config(plan),
                                               prepare=prepare, **overrides)
    optimizer = get_megatron_optimizer(ocfg, [model], config_overrides=lrg.optimizer_overrides(ocfg, group_overrides))
    optimizer_kernels.install()
    scheduler = mcfg.lr_scheduler(plan, optimizer)
    losses = []
    for step in range(steps):
        losses.append(forward_backward(model, data[step % len(data)]))
        optimizer.step()
        scheduler.step(increment=1)
    return losses, model.module


def adapted_logits(module, tokens: torch.Tensor) -> torch.Tensor:
    from orchestrator.convert.megatron_forward import pipeline_forward

    module.eval()
    positions = torch.arange(tokens.shape[1])[None].expand(tokens.shape[0], -1)
    return pipeline_forward(module, lambda m: m(tokens, positions, None), tokens.shape[1], tokens.shape[0])


def main() -> None:
    from orchestrator.convert.decoder_mapping import DecoderShape
    from orchestrator.plan.parallel_dims import ParallelDims
    from orchestrator.plan.resolved import Plan
    from orchestrator.runtime.distributed import init_distributed
    from tests.models.sharding import hf_to_megatron_full

    full_plan, lora_plan = Plan.load(sys.argv[1]), Plan.load(sys.argv[2])
    init_distributed(ParallelDims(), seed=0)
    steps = full_plan.train_iters
    # Gemma2 with its released softcaps (attention 50, final 30): the tiny model's 2 and 3,
    # which make the caps count in the forward parity, saturate as the loss falls to ~3.4
    # here, where tanh's vanishing gradient leaves Adam's normalised step to the rounding.
    makers = {"gemma2": lambda seed: hf_gemma2(seed=seed, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
              **HF_DECODERS}
    for family, make in makers.items():
        hf = make(seed=0)
        shape = DecoderShape.from_hf_config(hf.config)
        dec = decoder_config(hf.config)
        # copies: some of the converted tensors are the HF model's own, which its loop trains
        full = {k: v.detach().clone() for k, v in hf_to_megatron_full(hf.state_dict(), shape).items()}
        data = batches(shape.vocab_size, hf.config.pad_token_id)
        reference = hf_curve(hf, data, full_plan.section("optim"), steps) if dist.get_rank() == 0 else None
        runs = {f"{family}_tp2_sp": dict(tp=2, sp=True)}
        if family == "qwen3":
            runs["qwen3_bad_tp2_without_qk_layernorm"] = dict(tp=2, sp=False, qk_layernorm=False)
        for name, layout in runs.items():
            losses, _ = project_curve(full_plan, full, shape, dec, data, steps, **layout)
            if dist.get_rank() == 0:
                print("CURVE " + json.dumps({"case": name, "project": losses, "hf": reference}), flush=True)
        lora = {}
        for tp, sp in ((1, False), (2, True)):
            losses, module = project_curve(lora_plan, full, shape, dec, data, LORA_STEPS, tp, sp, lora=True)
            logits = adapted_logits(module, data[0])
            lora[tp] = (losses, logits[..., :shape.vocab_size],  # PP 1: every rank is the last stage
                        sorted(n for n, p in module.named_parameters() if p.requires_grad))
        if dist.get_rank() == 0:
            (l1, g1, names1), (l2, g2, names2) = lora[1], lora[2]
            print("CURVE " + json.dumps({
                "case": f"{family}_lora", "tp1": l1, "tp2_sp": l2, "logit_diff": (g1 - g2).abs().max().item(),
                "logit_scale": g1.abs().max().item(), "trainable": names2,
                "same_trainable_names": names1 == names2}), flush=True)
    from orchestrator.runtime.distributed import shutdown

    shutdown()


if __name__ == "__main__":
    main()
