"""Rules of the optimizer, the training loop and where the run goes: its experiment,
learning rate and schedule, profiling, the CTC loss and generation during training,
the launcher and the logger."""

from __future__ import annotations

import re
from typing import Iterator

from orchestrator.plan.schema import (
    DataConfig,
    LauncherConfig,
    LoggerConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    RunConfig,
    TrainConfig,
)
from orchestrator.plan.estimate import DEVICES
from orchestrator.plan.launcher_kinds import KINDS
from orchestrator.plan.wandb_settings import WANDB_MODES
from orchestrator.plan.rules.topology import world_size
from orchestrator.plan.rules.findings import Finding, error, one_of, positive, warning

# An sbatch option's name (launcher.additional_sbatch keys): mail-type, gres-flags, ...
_SBATCH_OPTION = re.compile(r"[a-z][a-z0-9-]*", re.IGNORECASE)


def check_own_experiment(recipe: str | None, run: RunConfig) -> Iterator[Finding]:
    """A recipe of the user's own (a copy of a shipped one, say) that kept a shipped recipe's
    run.experiment files its runs, and groups its W&B runs, with that recipe's."""
    from orchestrator.plan import config_path

    if not recipe:
        return
    file = config_path.recipe_files(config_path.user_dirs()).get(recipe)
    if file is None or file.origin == config_path.SHIPPED:
        return
    shipped = [name for name in config_path.shipped_experiments().get(run.experiment, []) if name != recipe]
    if shipped:
        yield warning("experiment", f"recipe {recipe} ({file.path}) has run.experiment={run.experiment}, the "
                                    f"experiment of the shipped recipe(s) {', '.join(shipped)}: its runs go under "
                                    f"{run.output_root}/{run.experiment}/ and its W&B runs into that group, among "
                                    f"theirs; set run.experiment to its own (e.g. {recipe}) unless that is meant")


def check_optim(optim: OptimConfig, train: TrainConfig) -> Iterator[Finding]:
    yield from one_of("optim", "optim.optimizer", optim.optimizer, ("adam", "sgd"))
    yield from one_of("optim", "optim.lr_decay_style", optim.lr_decay_style, ("cosine", "linear", "constant"))
    if optim.lr <= 0:
        yield error("lr", f"optim.lr={optim.lr} must be positive (freeze modules with lora.lr_groups lr_scale 0)")
    if optim.min_lr < 0 or optim.min_lr > optim.lr:
        yield error("min_lr", f"optim.min_lr ({optim.min_lr}) must be in [0, optim.lr ({optim.lr})]")
    if optim.lr_warmup_iters < 0 or optim.lr_warmup_iters >= max(train.iters, 1):
        yield error(
            "warmup",
            f"optim.lr_warmup_iters ({optim.lr_warmup_iters}) must be in [0, train.iters ({train.iters}))",
        )
    if optim.clip_grad < 0:
        yield error("optim", f"optim.clip_grad={optim.clip_grad} must be >= 0 (0 disables clipping)")
    if optim.weight_decay < 0:
        yield error("optim", f"optim.weight_decay={optim.weight_decay} must be >= 0 (0: none)")
    for key in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(optim, key) < 1.0:
            yield error("optim", f"optim.{key}={getattr(optim, key)} must be in [0, 1) (Adam's decay of its "
                                 f"moment estimates)")
    if optim.adam_eps <= 0:
        yield error("optim", f"optim.adam_eps={optim.adam_eps} must be positive (it keeps Adam's step finite)")


def check_train(train: TrainConfig, run: RunConfig) -> Iterator[Finding]:
    yield from positive(
        "train", **{"train.iters": train.iters, "train.log_interval": train.log_interval, "train.keep_last": train.keep_last}
    )
    for key in ("eval_interval", "save_interval", "save_interval_minutes", "hang_timeout", "straggler_threshold",
                "eval_iters", "eval_generation_batches", "keep_every"):
        if getattr(train, key) < 0:
            yield error("train", f"train.{key}={getattr(train, key)} must be >= 0")
    if train.eval_generation and train.eval_generation_max_new_tokens < 1:
        yield error("train", f"train.eval_generation_max_new_tokens={train.eval_generation_max_new_tokens} must be >= 1")
    yield from one_of("run", "run.resume", run.resume, ("auto", "never"))
    for key in ("experiment", "name"):  # OUTPUT_ROOT/EXPERIMENT/NAME: one directory name each
        value = getattr(run, key)
        if value is not None and ("/" in str(value) or str(value) in ("", ".", "..")):
            yield error("run", f"run.{key}={value!r} must be one directory name (no '/', not '.' or '..'): the run "
                               f"directory is run.output_root/run.experiment/run.name; put the parent directory in "
                               f"run.output_root")
    if train.seed < 0:
        yield error("train", f"train.seed={train.seed} must be >= 0 (numpy's generators take no negative seed)")


def check_profile(train: TrainConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    """train.profile_steps: off, or [first, last] steps of the run; train.profile_ranks:
    ranks the job has (orchestrator/train/profiling.py)."""
    steps, ranks, world = list(train.profile_steps), list(train.profile_ranks), world_size(launcher)
    if steps and not (len(steps) == 2 and 1 <= steps[0] <= steps[1] <= train.iters):
        yield error("profile", f"train.profile_steps={steps} must be [first, last] with 1 <= first <= last <= "
                               f"train.iters ({train.iters}), e.g. [10, 10] for one step; [] turns profiling off")
    outside = [r for r in ranks if not 0 <= r < world]
    if steps and (outside or not ranks):
        yield error("profile", f"train.profile_ranks={ranks} must name ranks of the job, 0 to {world - 1} "
                               f"(launcher.nodes {launcher.nodes} x launcher.gpus_per_node "
                               f"{launcher.gpus_per_node}), e.g. [0]")


def check_ctc(model: ModelConfig, parallel: ParallelConfig, train: TrainConfig) -> Iterator[Finding]:
    if model.adapter.ctc_weight > 0 and parallel.pp > 1:
        yield error("ctc", f"model.adapter.ctc_weight={model.adapter.ctc_weight}: the auxiliary CTC loss is computed "
                           f"on the first pipeline stage and added to the loss on the last, so it needs "
                           f"parallel.pp=1 (got {parallel.pp}); set model.adapter.ctc_weight=0 or parallel.pp=1")
    weight = train.eval_generation_ctc_weight
    if not 0 <= weight <= 1:
        yield error("ctc", f"train.eval_generation_ctc_weight={weight} must be within [0, 1] (0: the decoder alone)")
    elif weight > 0 and model.adapter.ctc_weight <= 0:
        # A warning: a recipe's decoding setting should not stop a run that turns the CTC
        # loss off (pipeline parallel needs that); generation_eval decodes with the decoder alone.
        yield warning("ctc", f"train.eval_generation_ctc_weight={weight} has no effect: joint CTC/attention decoding "
                             f"scores with the adapter's CTC head, which the model has only when trained with the "
                             f"CTC loss (model.adapter.ctc_weight={model.adapter.ctc_weight}); transcripts are decoded "
                             f"by the decoder alone")


def check_eval_generation(train: TrainConfig, data: DataConfig, parallel: ParallelConfig) -> Iterator[Finding]:
    if not train.eval_generation:
        return
    if not data.validation:
        yield error("eval_generation", "train.eval_generation=true needs validation datasets to decode, but "
                                       "data.validation is empty; add datasets to data.validation or set "
                                       "train.eval_generation=false")
    if (parallel.vpp or 1) > 1:
        yield warning("eval_generation", f"train.eval_generation=true: greedy decoding inside training does not run "
                                         f"with virtual pipeline chunks (parallel.vpp={parallel.vpp}), so training "
                                         f"reports no generation metrics; score checkpoints with `audiollm eval "
                                         f"RUN_DIR` (any layout: --tp, --pp)")


def check_launcher(launcher: LauncherConfig) -> Iterator[Finding]:
    yield from one_of("launcher", "launcher.kind", launcher.kind, tuple(KINDS))
    yield from one_of("launcher", "launcher.accelerator", launcher.accelerator, ("gpu", "cpu"))
    kind = KINDS.get(launcher.kind)
    if kind is not None and kind.one_machine and launcher.nodes != 1:
        several = sorted(name for name, other in KINDS.items() if not other.one_machine)
        yield error(
            "launcher",
            f"launcher.kind={launcher.kind} runs on this machine only, but launcher.nodes={launcher.nodes}; "
            f"use launcher={' or launcher='.join(several)} for several nodes",
        )
    if launcher.max_requeues < 0:
        yield error("launcher", f"launcher.max_requeues={launcher.max_requeues} must be >= 0")
    if "." not in launcher.entry.replace(":", "."):
        yield error("launcher", f"launcher.entry={launcher.entry!r} must be a dotted path 'package.module.function'")
    for key in ("cpus_per_task", "timeout_min", "signal_delay_s", "array_parallelism"):
        if getattr(launcher, key) < 1:
            yield error("launcher", f"launcher.{key}={getattr(launcher, key)} must be at least 1")
    yield from one_of("launcher", "launcher.gpu_type", launcher.gpu_type, tuple(g for g in DEVICES if g != "cpu"))
    for key in ("intra_node_gb_s", "inter_node_gb_s"):
        value = getattr(launcher, key)
        if value is not None and value <= 0:
            yield error("launcher", f"launcher.{key}={value} must be positive, or null for the GPU type's own figure")
    if launcher.mem_gb is not None and launcher.mem_gb < 0:
        yield error("launcher", f"launcher.mem_gb={launcher.mem_gb} must be >= 0 (0: all of a node's memory, "
                                f"as sbatch --mem=0 means; null: the cluster's default)")
    for key in launcher.additional_sbatch:
        if not _SBATCH_OPTION.fullmatch(str(key)):
            yield error("launcher", f"launcher.additional_sbatch has the key {str(key)!r}, which is no sbatch option "
                                    f"(#SBATCH --KEY=VALUE: letters, digits and dashes, e.g. mail-type)")


def check_logger(logger: LoggerConfig) -> Iterator[Finding]:
    yield from one_of("logger", "logger.backend", logger.backend, ("wandb", "none"))
    if logger.mode is not None:  # null: $WANDB_MODE, read by the job
        yield from one_of("logger", "logger.mode", logger.mode, WANDB_MODES)
