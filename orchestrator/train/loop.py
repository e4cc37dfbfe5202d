"""The training loop of one rank: model chunks -> LoRA -> lr groups -> DDP ->
megatron optimizer + scheduler -> resume -> steps (1F1B, interleaved with virtual
pipeline stages) -> metrics, checkpoints, evaluation.

Transforms on the model run in this fixed order, because each needs the previous:
  1. build chunks (every parameter exists, names follow the contract), and load
     model.init_checkpoint into them (pretrained weights, before anything wraps them),
  2. LoRA (adds adapter parameters, freezes the adapted base weights),
  3. model-level freezes (model.*.freeze),
  4. lr groups (freeze lr_scale-0 groups; tag the rest) -- must see the final set of
     trainable parameters and run before DDP, which allocates gradient buffers only
     for parameters that require grad,
  5. DDP, then the optimizer (param groups from the tags).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

from orchestrator.data.loader import BadSampleError, bad_share_problem
from orchestrator.plan.checkpoint_dirs import frozen_source, set_aside_dirs, step_dirs
from orchestrator.runtime.machine import Machine, decide
from orchestrator.train import checkpoint as ckpt
from orchestrator.train import lr_groups as lrg
from orchestrator.train import megatron_config as mcfg
from orchestrator.models.compile import compile_layers
from orchestrator.train.lora import apply_lora
from orchestrator.train import optimizer_kernels
from orchestrator.train.metrics import (LossStats, MetricsWriter, eval_line, memory_gib, peak_flops, plot_loss_curve,
                                        progress_line, run_summary, throughput)
from orchestrator.train.profiling import StepProfiler
from orchestrator.plan.resolved import Plan
from orchestrator.train.save_clock import SaveClock
from orchestrator.train.stragglers import StepTimer, straggler_line, stragglers
from orchestrator.plan.step_flops import parameter_pattern

log = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or Inf: the run stops before the optimizer step, so no
    poisoned weights are ever saved."""


@dataclass
class Components:
    provider: object  # components.ModelProvider
    train_source: object  # components.BatchSource
    val_source: Optional[object] = None  # components.BatchSource (restarted for each evaluation)
    # Optional generation-based evaluation (greedy decoding + each validation dataset's
    # metric: WER, exact, BLEU): called as generation_eval(trainer, step) -> {metric: value}
    # on every rank.
    generation_eval: Optional[Callable] = None
    lora_b_init_std: float = 0.0  # tests: non-zero B so adapters change the output at once


@dataclass
class StepResult:
    step: int
    metrics: dict = field(default_factory=dict)


def freeze_model_parts(chunks, model_cfg: dict) -> None:
    """model.{encoder,adapter,decoder}.freeze: base weights of that part stop training
    (LoRA adapters stay trainable)."""
    prefixes = {"encoder": "encoder.", "adapter": "adapter.", "decoder": "language_model."}
    frozen = [p for part, p in prefixes.items() if (model_cfg.get(part) or {}).get("freeze")]
    if not frozen:
        return
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if any(name.startswith(p) for p in frozen) and ".lora_" not in name:
                param.requires_grad_(False)


class Trainer:
    def __init__(self, plan: Plan, components: Components, device: str, training: bool = True,
                 machine: Optional[Machine] = None):
        """training=False (evaluation): the same model chunks (LoRA included, so a
        checkpoint's names match), no DDP, optimizer or scheduler. `machine`: what the
        model is built for, this machine unless given (the full-size probe, which runs on
        CPU, builds for the plan's GPU: orchestrator/probe/)."""
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
        from megatron.core.optimizer import get_megatron_optimizer

        self.plan, self.components, self.device = plan, components, device
        self.ps = ps
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        train_cfg = plan.section("train")
        self.train_cfg = train_cfg
        self.train_iters = plan.train_iters
        self.seed = plan.seed
        provider = components.provider
        self.decisions = decide(plan.section("model"), machine or Machine.probe(), plan.dims,
                                plan.transformer_fields.get("recompute_granularity"))
        on_gpu = self.decisions.cuda
        if self.rank == 0:
            log.info("decided on this machine:\n  %s", "\n  ".join(self.decisions.lines))
        # The one TransformerConfig: DDP, the pipeline schedule and the model's layers read it.
        self.config = mcfg.transformer_config(plan, on_gpu, self.decisions.gradient_accumulation_fusion)
        # Looked for before the build: where a checkpoint will overwrite every weight that
        # megatron and the Whisper encoder draw (a resume; model.init_checkpoint, whose
        # fresh modules, LoRA, the adapter, the CTC head, draw their own; evaluation, which
        # loads each checkpoint it scores), those draws are skipped. They make the full
        # master weights on the host of every rank, about a minute for a 9B decoder, and
        # none of it would survive the load.
        self.resume_from = self._resumable_checkpoint() if training else None
        init_path = self._init_checkpoint_path() if training else None
        weights_from = self.resume_from or init_path or (None if training else "the checkpoint evaluated")
        if weights_from:
            mcfg.skip_random_init(self.config)
            if self.rank == 0:
                log.info("random initialisation skipped: %s overwrites the weights it would draw", weights_from)
        chunks = self._build_chunks(provider)
        init = self._load_init_checkpoint(init_path, chunks) if init_path else None
        self.adapted = []
        for chunk in chunks:
            self.adapted += apply_lora(chunk, plan.section("lora"), self.seed, b_std=components.lora_b_init_std)
        if init is not None:
            if int(plan.section("lora").get("rank") or 0) > 0:  # an adapter to fine-tune on, if it holds one
                from orchestrator.train.init_weights import load_init_lora

                init["lora_names"] = load_init_lora(init["path"], chunks, plan.section("lora"))
            self._log_init(init, chunks)
        freeze_model_parts(chunks, plan.section("model"))
        self.frozen = self._frozen_weights(init, chunks) if training else None
        if init is None and plan.section("model").get("allow_frozen_random") and self.rank == 0:
            log.warning("frozen weights are random (model.allow_frozen_random=true, no model.init_checkpoint): "
                        "this run measures speed and memory; its losses and scores mean nothing")
        # Last of the model transforms: the compiled layers see LoRA and the freezes as they are.
        for chunk in chunks:
            compile_layers(chunk, self.decisions.compile, backend=self._compile_backend())
        self.unwrapped = chunks
        self.stats = LossStats(components.train_source.dataset_names)
        self.val_stats = LossStats(components.val_source.dataset_names) if components.val_source else None
        self._local_stats: list = []
        self.last_stats: Optional[torch.Tensor] = None
        self.step = 0
        self._val_initial_state = components.val_source.state_dict() if components.val_source else None
        from orchestrator.runtime import job_control

        self.progress = job_control.progress  # read by the watchdog thread (launchers/watchdog.py)
        if not training:
            self.chunks = chunks
            return
        ocfg = mcfg.optimizer_config(plan, on_gpu)
        overrides, self.group_members, self.group_scales = lrg.apply_lr_groups(
            chunks, lrg.plan_groups(plan.section("lora")), ocfg.lr, ocfg.min_lr,
        )
        ddp_cfg = mcfg.ddp_config(plan)
        ddp_cfg.check_for_nan_in_grad = True
        self.chunks = [
            DistributedDataParallel(config=self.config, ddp_config=ddp_cfg, module=chunk, disable_bucketing=i > 0)
            for i, chunk in enumerate(chunks)
        ]
        # The schedules run every micro-batch's backward but the last under no_sync, so the
        # data-parallel gradient reduction happens once per step; with overlap_grad_reduce
        # it then starts bucket by bucket from the last micro-batch's backward hooks
        # (grad_sync_func lets the pipeline schedules start it per model chunk).
        self.config.no_sync_func = _per_chunk([chunk.no_sync for chunk in self.chunks])
        if ddp_cfg.overlap_grad_reduce:
            self.config.grad_sync_func = _per_chunk([chunk.start_grad_sync for chunk in self.chunks])
        self._finalize = finalize_model_grads
        self.config.finalize_model_grads_func = self._finalize_with_loss_check
        self.optimizer = get_megatron_optimizer(ocfg, self.chunks, config_overrides=lrg.optimizer_overrides(ocfg, overrides))
        optimizer_kernels.install()  # foreach kernels where megatron would loop per tensor
        if self.rank == 0:
            log.info(optimizer_kernels.describe(self.optimizer))
        self.scheduler = mcfg.lr_scheduler(plan, self.optimizer)
        self.count_flops = self._flop_counter(provider, chunks)
        self.peak_flops, peak_source = peak_flops(torch.cuda.get_device_name() if device == "cuda" else None,
                                                  plan.section("launcher").get("gpu_type"))
        if self.rank == 0 and self.peak_flops:
            log.info("MFU against %.1f TFLOP/s per GPU, the dense bf16 peak of %s", self.peak_flops / 1e12, peak_source)
        elif self.rank == 0:
            log.info("no MFU: %s", peak_source)
        self.callbacks: list = []  # called as cb(trainer, step) after each step (and its checkpoint)
        self.should_stop = job_control.should_stop  # collective; see orchestrator/runtime/job_control.py
        self.timer = StepTimer()  # this rank's step parts, for the straggler report
        # train.async_save: checkpoint files written by a forked process while training goes on
        self.background = ckpt.BackgroundSaves() if self.train_cfg.get("async_save") else None
        self.checkpoint_metrics: dict = {}  # the last save's stall (and write), for the next metrics row

    # ---- construction -------------------------------------------------------------
    def _compile_backend(self):
        """torch.compile's backend for the compiled layers (the probe's counts their memory)."""
        return "inductor"

    def _build_chunks(self, provider):
        ps = self.ps
        vpp = self.plan.dims.vpp
        chunks = []
        for vp_stage in (range(vpp) if vpp else [None]):
            pre = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
            post = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
            model = provider.build(self.config, pre, post, vp_stage, self.decisions)
            if self.device == "cuda":
                model.cuda(torch.cuda.current_device())
            # A provider whose model keeps its own mixed precision opts out of the cast.
            if self.config.bf16 and getattr(provider, "wrap_float16", True):
                from megatron.core.transformer.module import Float16Module

                model = Float16Module(self.config, model)
            chunks.append(model)
        return chunks

    def _init_checkpoint_path(self) -> Optional[str]:
        """model.init_checkpoint where this job loads it: only when the run starts fresh (a
        resumed run has its own checkpoint)."""
        path = self.plan.section("model").get("init_checkpoint")
        resumes = (self.plan.section("run").get("resume") or "auto") != "never"
        if not path or (resumes and (step_dirs(self.plan.run_dir) or set_aside_dirs(self.plan.run_dir))):
            return None
        return path

    def _load_init_checkpoint(self, path: str, chunks) -> dict:
        """model.init_checkpoint: pretrained weights, before LoRA and the freezes."""
        from orchestrator.train.init_weights import load_init_checkpoint

        lora = int(self.plan.section("lora").get("rank") or 0) > 0
        return {"path": path, **load_init_checkpoint(path, chunks, lora=lora)}

    def _frozen_weights(self, init: Optional[dict], chunks) -> Optional[ckpt.FrozenWeights]:
        """Collective: what this run's checkpoints leave out (train.save_frozen_weights=false):
        the frozen tensors it read from model.init_checkpoint, or at a resume, those the
        checkpoint it resumes from left there."""
        if self.train_cfg.get("save_frozen_weights"):
            return None
        record = frozen_source(self.resume_from) if self.resume_from is not None else None
        if init is not None:
            source, loaded = init["path"], init["keys"]
        elif record is not None:
            source, loaded = record["source"], record["tensors"]
        else:
            return None
        frozen = ckpt.frozen_weights(chunks, source, loaded)
        if frozen is not None and self.rank == 0:
            log.info("checkpoints leave out %d frozen tensors: they are read back from %s "
                     "(train.save_frozen_weights=false)", len(frozen.keys), source)
            self._hold(source)
        return frozen

    def _hold(self, source: str) -> None:
        """Rank 0: where `source` is another run's checkpoint, that run's retention must
        not delete it while this run's checkpoints read their frozen weights there."""
        from orchestrator.plan.checkpoint_dirs import hold_checkpoint

        try:
            hold_checkpoint(Path(source), self.plan.run_dir)
        except OSError as exc:
            log.warning("could not mark %s as read by this run's checkpoints (%s): the run that wrote it may delete "
                        "it (train.keep_last), and this run's checkpoints would then be refused; copy it elsewhere "
                        "and point model.init_checkpoint there, or set train.save_frozen_weights=true", source, exc)

    def _log_init(self, init: dict, chunks) -> None:
        """One line: what was loaded, and what starts fresh (LoRA included, added after the load)."""
        from orchestrator.train.init_weights import describe

        stage = self.ps.get_pipeline_model_parallel_rank()  # layer names restart at 0 on every stage
        lora = {(stage, i, name) for i, chunk in enumerate(chunks) for name, _ in chunk.named_parameters()
                if ".lora_" in name}
        loaded = {(stage, i, name) for i, names in enumerate(init.pop("lora_names", [])) for name in names}
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, (lora, loaded))
        lora, loaded = (set().union(*(g[k] for g in gathered)) for k in (0, 1))
        init["lora_loaded"] = len(loaded)
        if lora - loaded:
            init["fresh"]["LoRA"] = len(lora - loaded)
        if self.rank == 0:
            log.info("%s", describe(init["path"], init))

    def _flop_counter(self, provider, chunks) -> Callable[[dict], dict]:
        """batch -> {'model', 'hardware' FLOPs, 'tokens' (real), 'slots'}: the provider's
        counter, told which parameters train on any rank (names with layer numbers as `*`)."""
        trained = {parameter_pattern(name) for chunk in chunks for name, p in chunk.named_parameters()
                   if p.requires_grad}
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, trained)
        return provider.flop_counter(set().union(*gathered))

    def _step_counts(self, microbatches: list) -> dict:
        """Real tokens, token slots and model/hardware FLOPs of the step: summed over its
        micro-batches and every data-parallel rank. All ranks of one model replica (TP
        ranks, pipeline stages, CP ranks) draw the same micro-batches, so one of them
        (TP, PP and CP rank 0) counts them, as read (a CP rank's share keeps the micro-batch
        it came from as `cp_unsplit`); the model is counted whole, not per stage."""
        ps = self.ps
        names = self.components.train_source.dataset_names
        local = torch.zeros(4 + 2 * len(names), dtype=torch.float64)
        if (ps.get_tensor_model_parallel_rank() == 0 and ps.get_pipeline_model_parallel_rank() == 0
                and ps.get_context_parallel_rank() == 0):
            for batch in microbatches:
                c = self.count_flops(batch.get("cp_unsplit", batch))
                local[:4] += torch.tensor([c["tokens"], c["slots"], c["model"], c["hardware"]], dtype=torch.float64)
            # The replica's reader (this rank: the lowest global rank of its replica) counts
            # the samples it skipped and read, summed below over the job.
            counts = self.components.train_source.sample_counts()
            local[4:] = torch.tensor([counts.get(f"bad_samples/{n}", 0) for n in names]
                                     + [counts.get(f"read_samples/{n}", 0) for n in names], dtype=torch.float64)
        local = local.to("cuda" if self.device == "cuda" else "cpu")
        dist.all_reduce(local)
        tokens, slots, model, hardware, *samples = local.tolist()
        self._judge_bad_samples(dict(zip(names, samples[:len(names)])), dict(zip(names, samples[len(names):])))
        return {"tokens": tokens, "slots": slots, "model": model, "hardware": hardware}

    def _judge_bad_samples(self, bad: dict, read: dict) -> None:
        """data.max_bad_fraction over the whole job: the samples every data-parallel rank
        skipped and read, summed (a broken dataset spread over many ranks shows few bad
        samples on each). Every rank has the same sums, so every rank stops together."""
        data = self.plan.section("data")
        if data.get("on_bad_sample") != "skip" or not any(bad.values()):
            return
        problem = bad_share_problem({n: b for n, b in bad.items() if b}, read, float(data.get("max_bad_fraction", 1.0)),
                                    over=f" by the job's {self.ps.get_data_parallel_world_size()} data-parallel "
                                         f"rank(s) together")
        if problem:
            raise BadSampleError(problem)

    # ---- one step -------------------------------------------------------------------
    def _loss_func(self, batch: dict, per_token_loss: torch.Tensor):
        mask = batch["loss_mask"].to(per_token_loss.device).float()
        loss_sum = (per_token_loss.float() * mask).sum()
        num_tokens = mask.sum().nan_to_num(0.0).to(torch.int)
        stats = self.stats_for_batch.of_microbatch(per_token_loss, mask, batch["dataset_index"])
        self._local_stats.append(stats)
        return loss_sum, num_tokens, {"loss_sum": loss_sum.detach()}

    def _forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        output = self.components.provider.forward(model, batch)
        return output, partial(self._loss_func, batch)

    def _reduce_stats(self, stats_layout: LossStats) -> torch.Tensor:
        """Sum the step's loss statistics over all ranks: only the ranks that computed
        a loss (last pipeline stage) and of them TP rank 0 contribute."""
        local = stats_layout.zeros()
        if self._local_stats and self.ps.get_tensor_model_parallel_rank() == 0:
            local = torch.stack([s.cpu() for s in self._local_stats]).sum(0)
        self._local_stats = []
        device = "cuda" if self.device == "cuda" else "cpu"
        local = local.to(device)
        dist.all_reduce(local)
        return local.cpu()

    def _finalize_with_loss_check(self, model, num_tokens=None, **kwargs):
        """Runs at the end of forward-backward, before gradients are reduced and long
        before the optimizer step: a NaN/Inf loss stops the run here on every rank."""
        if self.device == "cuda":  # what the GPU computed, not what the host had queued (and not
            torch.cuda.current_stream().synchronize()  # the overlapped gradient reduction's wait)
        self.timer.lap("compute")  # this rank's forward/backward ends; the step's collectives begin
        stats = self._reduce_stats(self.stats)
        self.last_stats = stats
        if not (math.isfinite(float(stats[0])) and math.isfinite(float(stats[1]))):
            raise TrainingDiverged(
                f"loss is {float(stats[0] / stats[1]) if stats[1] else float(stats[0])} at step {self.step + 1}: "
                f"datasets in this step's batch: {self.stats.datasets_present(stats)}; "
                f"datasets with a non-finite loss: {self.stats.datasets_not_finite(stats)}. "
                f"The run stops before the optimizer step; the last checkpoint is untouched."
            )
        return self._finalize(model, num_tokens, **kwargs)

    def _run_schedule(self, microbatches: list, forward_only: bool):
        from megatron.core.pipeline_parallel import get_forward_backward_func

        iterators = [iter(microbatches) for _ in self.chunks]
        return get_forward_backward_func()(
            forward_step_func=self._forward_step,
            data_iterator=iterators if len(self.chunks) > 1 else iterators[0],
            model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
            num_microbatches=len(microbatches), seq_length=self.plan.seq_length,
            micro_batch_size=self.plan.micro_batch_size, forward_only=forward_only,
        )

    def train_step(self) -> dict:
        source = self.components.train_source
        self.stats_for_batch = self.stats
        start = time.perf_counter()
        self.timer.start()
        microbatches = [source.next_microbatch() for _ in range(self.plan.num_microbatches)]
        # The step waits for its data here (reading and decoding when data.num_workers=0,
        # only packing and collation when workers prepare samples ahead).
        data_wait = time.perf_counter() - start
        self.timer.lap("data_wait")
        for chunk in self.chunks:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        lrs = lrg.group_learning_rates(self.optimizer, self.group_scales)  # the rates this step uses
        self._run_schedule(microbatches, forward_only=False)
        self.timer.lap("sync")
        _, grad_norm, _ = self.optimizer.step()
        self.scheduler.step(increment=1)
        self.step += 1
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.timer.lap("optimizer")
        self.timer.step_done()
        elapsed = time.perf_counter() - start
        metrics = self.stats.summary(self.last_stats)
        if grad_norm is not None:
            metrics["grad_norm"] = float(grad_norm)
        metrics.update({f"lr/{k}": v for k, v in lrs.items()})
        # Counted after the timed part: the step's time is its own.
        metrics.update(throughput(elapsed, self._step_counts(microbatches), self.world_size, self.peak_flops))
        metrics.update(memory_gib())
        metrics["step_time_s"] = elapsed
        metrics["data_wait_s"] = data_wait
        metrics.update(source.sample_counts())  # this rank's skipped and truncated samples so far
        return metrics

    # ---- evaluation --------------------------------------------------------------------
    def evaluate(self) -> dict:
        """Validation loss per dataset over train.eval_iters batches of the validation
        source (restarted from its beginning each time)."""
        source = self.components.val_source
        if source is None:
            return {}
        self.progress(self.step, "eval")
        try:
            return self._evaluate(source)
        finally:
            self.progress(self.step, "train")

    def _evaluate(self, source) -> dict:
        source.load_state_dict(self._val_initial_state)
        self.stats_for_batch = self.val_stats
        for chunk in self.chunks:
            chunk.eval()
        total = self.val_stats.zeros()
        with torch.no_grad():
            for _ in range(int(self.train_cfg.get("eval_iters", 1))):
                microbatches = [source.next_microbatch() for _ in range(self.plan.num_microbatches)]
                self._run_schedule(microbatches, forward_only=True)
                total += self._reduce_stats(self.val_stats)
        for chunk in self.chunks:
            chunk.train()
        out = self.val_stats.summary(total, prefix="val_loss")
        if self.components.generation_eval is not None:
            out.update(self.components.generation_eval(self, self.step))
        return out

    # ---- the run ---------------------------------------------------------------------
    def _run_id(self, from_checkpoint: Optional[str]) -> str:
        """One W&B run id per run directory, fixed at its first start (the launcher's
        record), or the one the checkpoint carries."""
        from orchestrator.runtime import job_control

        obj = [from_checkpoint or (job_control.wandb_run_id(self.plan.run_dir) if self.rank == 0 else None)]
        dist.broadcast_object_list(obj, src=0)
        return obj[0]

    def _resumable_checkpoint(self) -> Optional[Path]:
        """Collective: the checkpoint this run continues from (run.resume), or None."""
        if (self.plan.section("run").get("resume") or "auto") == "never":
            return None
        return ckpt.resumable_checkpoint(self.plan.run_dir)

    def resume(self) -> Optional[str]:
        latest = self.resume_from
        if latest is None:
            return None
        info = ckpt.load_checkpoint(latest, self.chunks, self.optimizer, self.scheduler, self.components.train_source)
        self.step = info["step"]
        if self.rank == 0:
            log.info("resumed from %s at step %d", latest, self.step)
        return info["wandb_run_id"]

    def _straggler_report(self, first_step: int) -> dict:
        """Gather every rank's step parts since the last report; on rank 0, name the ranks
        slower than the median by more than train.straggler_threshold (console and metrics)."""
        per_rank = self.timer.gather(self.rank, self.world_size)
        if per_rank is None:
            return {}
        slow = stragglers(per_rank, float(self.train_cfg.get("straggler_threshold", 0.2)))
        if not slow:
            return {}
        print(straggler_line(first_step, self.step, slow), flush=True)
        return {"stragglers": [s["rank"] for s in slow],
                **{f"straggler/rank{s['rank']}_over_median": s["over"] for s in slow}}

    def save(self) -> Path:
        """Collective: a checkpoint of this step, published before this returns, or with
        train.async_save written in the background and published by finish_saves."""
        self.progress(self.step, "save")
        start = time.perf_counter()
        try:
            path = ckpt.save_checkpoint(self.plan.run_dir, self.step, self.chunks, self.optimizer, self.scheduler,
                                        self.components.train_source, self.run_id,
                                        ckpt.Retention(int(self.train_cfg.get("keep_last", 2)),
                                                       int(self.train_cfg.get("keep_every", 0))),
                                        background=self.background, frozen=self.frozen)
        finally:
            self.progress(self.step, "train")
        stall = time.perf_counter() - start
        self.checkpoint_metrics["checkpoint/stall_s"] = stall
        if self.rank == 0:
            log.info("checkpoint %s: training stalled %.3f s%s", path.name, stall,
                     ", its files are written in the background" if self.background else "")
        self._report_published()  # the save before it, published first
        return path

    def finish_saves(self, wait: bool = False) -> None:
        """Collective: publish the background saves every rank has written (all, with `wait`)."""
        if self.background is None or not self.background.pending():
            return
        if wait:  # the whole background write: a phase of its own, longer than a save's stall
            self.progress(self.step, "save_wait")
        self.background.finish(blocking=wait)
        if wait:
            self.progress(self.step, "train")
        self._report_published()

    def _report_published(self) -> None:
        if self.background is None:
            return
        for name, seconds in self.background.published:
            self.checkpoint_metrics["checkpoint/background_write_s"] = seconds
            if self.rank == 0:
                log.info("checkpoint %s published, %.1f s after its save", name, seconds)
        self.background.published.clear()

    def run(self) -> list:
        """Train to train_iters; returns the per-step metrics (rank 0; others get [])."""
        from orchestrator.runtime.job_control import END_PHASE

        run_id_from_ckpt = self.resume()
        self.run_id = self._run_id(run_id_from_ckpt)
        writer = None
        if self.rank == 0:
            layout = {**self.plan.dims.as_dict(), "num_microbatches": self.plan.num_microbatches,
                      "tokens_per_step": self.plan.tokens_per_step}
            writer = MetricsWriter(self.plan.run_dir, self.plan.section("logger"), self.plan.section("run"),
                                   self.run_id, self.step, config_for_wandb={**self.plan.config, "plan": layout})
        save_interval = int(self.train_cfg.get("save_interval", 0))
        clock = SaveClock(self.train_cfg.get("save_interval_minutes", 0), self.rank)
        eval_interval = int(self.train_cfg.get("eval_interval", 0))
        log_interval = max(int(self.train_cfg.get("log_interval", 1)), 1)
        history = []
        exit_code = 1
        profiler = StepProfiler(self.train_cfg.get("profile_steps") or [], self.train_cfg.get("profile_ranks") or [0],
                                self.rank, self.plan.run_dir, self.device)
        try:
            if self.train_cfg.get("eval_at_start") and self.step == 0:
                metrics = self.evaluate()
                if writer is not None and metrics:
                    writer.log(0, metrics)
                    history.append({"step": 0, **metrics})
                    print(eval_line(0, metrics), flush=True)  # metrics hold the validation loss
            while self.step < self.train_iters:
                profiler.before_step(self.step + 1)
                metrics = self.train_step()
                self.progress(self.step, "train")
                if profiler.after_step(self.step):
                    metrics["profiled"] = 1  # slowed by the profiler: not a throughput figure
                self.finish_saves()
                metrics.update(self.checkpoint_metrics)
                self.checkpoint_metrics = {}
                last = self.step == self.train_iters
                if self.step % log_interval == 0 or last:  # collective: every rank, the same steps
                    metrics.update(self._straggler_report(self.step - self.timer.steps + 1))
                if (eval_interval and self.step % eval_interval == 0) or last:
                    metrics.update(self.evaluate())
                if writer is not None:
                    writer.log(self.step, metrics)
                    history.append({"step": self.step, **metrics})
                    if self.step % log_interval == 0 or last or self.step == 1:
                        print(progress_line(self.step, self.train_iters, metrics), flush=True)
                    evaluated = eval_line(self.step, metrics)
                    if evaluated:
                        print(evaluated, flush=True)
                saved = clock.due() or (save_interval and self.step % save_interval == 0) or last
                if saved:
                    self.save()
                    clock.saved()
                for callback in self.callbacks:
                    callback(self, self.step)
                # The launcher's stop request (preemption, time limit, cancel): a
                # collective, so every rank stops after the same step, checkpointed.
                if not last and self.should_stop():
                    if not saved:
                        self.save()
                    self.finish_saves(wait=True)
                    if self.rank == 0:
                        log.info("stop requested: checkpoint of step %d written, exiting for requeue", self.step)
                    break
            self.finish_saves(wait=True)
            self.progress(self.step, END_PHASE)  # what follows is this rank's own: a peer may exit meanwhile
            exit_code = 0
        except OSError as exc:  # the run's own files (metrics.jsonl, the loss curve, W&B's)
            if not ckpt.is_disk_full(exc, self.plan.run_dir):
                raise
            raise ckpt.DiskFull(f"disk full at {self.plan.run_dir} after step {self.step} ({exc}); free space there "
                                f"and run the same command again: it resumes from the latest checkpoint") from exc
        finally:
            profiler.close()
            if writer is not None:
                try:
                    writer.finish(exit_code)
                    plot_loss_curve(self.plan.run_dir)
                except Exception as exc:  # noqa: BLE001 - after a failure, the failure is what to report
                    if exit_code == 0:
                        raise
                    log.warning("the loss curve and the logger's end were not written: %s", exc)
        if writer is not None and self.step == self.train_iters:
            print(run_summary(self.plan.run_dir, self.plan.config.get("recipe")), flush=True)
        return history


def _per_chunk(functions: list):
    """megatron's schedules take one function, or a list with one per virtual pipeline chunk."""
    return functions[0] if len(functions) == 1 else functions
