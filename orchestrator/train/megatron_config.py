"""megatron-core configs built from the Plan (one source of truth).

The TransformerConfig from the Plan's `transformer_fields` (the plan side's one translation
of the model, orchestrator/plan/megatron_fields.py) and its dims, through the one builder
(orchestrator/models/decoder_config.py), with what the job itself decides (dtype, fusions
that need what is installed). The result is the job's one TransformerConfig: DDP, the
pipeline schedule and the model's layers all read it. The optimizer, DDP config and
learning-rate schedule from the Plan's megatron_args (Megatron-LM's argparse names).
"""

from __future__ import annotations

import torch

from orchestrator.models.device_draws import INIT_METHODS
from orchestrator.plan.resolved import Plan


def compute_dtype(plan: Plan, on_gpu: bool) -> torch.dtype:
    return torch.bfloat16 if (on_gpu and plan.arg("bf16", False)) else torch.float32


# The weights' random draws. Where a checkpoint overwrites every weight megatron draws (a
# resume, model.init_checkpoint, an evaluation) the job replaces them by _draw_nothing: megatron's layers still allocate each
# weight and mark its tensor-parallel split, which config.perform_initialization=False would
# skip as well (megatron-core 0.16: the split's marks are set by the init function, and
# without them the gradient norm counts every TP shard as a duplicate). On a GPU the draws
# that stay are made there (orchestrator.models.device_draws).
def _draw_nothing(weight: torch.Tensor) -> None:
    """An init method that leaves the weight as allocated: a checkpoint overwrites it."""


def skip_random_init(config) -> None:
    for name in INIT_METHODS:
        setattr(config, name, _draw_nothing)


def draws_random_init(config) -> bool:
    """False where the job skipped the draws (skip_random_init)."""
    return config.init_method is not _draw_nothing


def transformer_config(plan: Plan, on_gpu: bool, gradient_accumulation_fusion: bool = False):
    """The job's one TransformerConfig: the loop's DDP and pipeline schedule and the
    model's layers all read it. The Plan's `transformer_fields` as they are (the plan
    side's one translation of the model), its sizes (`plan.dims`, as megatron's parallel
    state has them), and what the job decides on this machine: the dtype,
    `gradient_accumulation_fusion` (orchestrator.runtime.machine.decide; the plan leaves it
    open on GPUs) and the per-token loss."""
    from orchestrator.models.decoder_config import build_transformer_config

    return build_transformer_config(
        plan.transformer_fields, plan.dims, compute_dtype(plan, on_gpu), on_gpu=on_gpu,
        gradient_accumulation_fusion=gradient_accumulation_fusion,
        # Loss is summed per token and normalised by the step's token count over all
        # micro-batches and DP ranks (packed rows carry different numbers of targets).
        calculate_per_token_loss=True)


def optimizer_config(plan: Plan, on_gpu: bool):
    from megatron.core.optimizer import OptimizerConfig

    optim = plan.section("optim")
    dtype = compute_dtype(plan, on_gpu)

    def pick(name, default):
        value = plan.arg(name)
        return optim.get(name, default) if value is None else value

    return OptimizerConfig(
        optimizer=pick("optimizer", "adam"),
        lr=float(pick("lr", 1e-4)),
        min_lr=float(pick("min_lr", 0.0)),
        weight_decay=float(pick("weight_decay", 0.0)),
        adam_beta1=float(pick("adam_beta1", 0.9)),
        adam_beta2=float(pick("adam_beta2", 0.999)),
        adam_eps=float(pick("adam_eps", 1e-8)),
        clip_grad=float(pick("clip_grad", 0.0)),
        bf16=dtype == torch.bfloat16,
        fp16=False,
        params_dtype=dtype,
        use_distributed_optimizer=bool(plan.arg("use_distributed_optimizer", False)),
    )


def ddp_config(plan: Plan):
    from megatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        # On GPU with DP > 1 (the plan decides: megatron_args.gpu_performance_args).
        overlap_grad_reduce=bool(plan.arg("overlap_grad_reduce", False)),
        use_distributed_optimizer=bool(plan.arg("use_distributed_optimizer", False)),
        average_in_collective=False,  # required with per-token loss normalisation
        # Bucketed all-reduce; None would mean one bucket per model chunk.
        bucket_size=None,
    )


def lr_scheduler(plan: Plan, optimizer):
    """megatron-core's OptimizerParamScheduler: linear warmup from 0 to each group's
    max_lr over lr_warmup_iters, then `lr_decay_style` (cosine by default) down to each
    group's min_lr at lr_decay_iters (default: train_iters). Weight decay constant."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    ocfg = optimizer_config_values(plan)
    train_iters = plan.train_iters
    decay_iters = int(plan.arg("lr_decay_iters", train_iters))
    warmup = int(plan.arg("lr_warmup_iters", plan.section("optim").get("lr_warmup_iters", 0)))
    if warmup >= decay_iters:
        raise ValueError(
            f"lr_warmup_iters ({warmup}) must be smaller than lr_decay_iters ({decay_iters}, "
            f"train_iters {train_iters}): lower optim.lr_warmup_iters or raise train.iters"
        )
    return OptimizerParamScheduler(
        optimizer,
        init_lr=float(plan.arg("lr_warmup_init", 0.0)),
        max_lr=ocfg["lr"], min_lr=ocfg["min_lr"],
        lr_warmup_steps=warmup, lr_decay_steps=decay_iters,
        lr_decay_style=str(plan.arg("lr_decay_style", plan.section("optim").get("lr_decay_style", "cosine"))),
        start_wd=ocfg["weight_decay"], end_wd=ocfg["weight_decay"],
        wd_incr_steps=max(train_iters, 1), wd_incr_style="constant",
        # A resumed run continues the checkpoint's schedule.
        use_checkpoint_opt_param_scheduler=True, override_opt_param_scheduler=False,
    )


def optimizer_config_values(plan: Plan) -> dict:
    optim = plan.section("optim")
    out = {}
    for name, default in (("lr", 1e-4), ("min_lr", 0.0), ("weight_decay", 0.0)):
        value = plan.arg(name)
        out[name] = float(optim.get(name, default) if value is None else value)
    return out
