"""One rank role of a plan, probed:
`python -m orchestrator.probe.role PLAN_JSON STAGE CP_RANK OUT_JSON`.

PLAN_JSON: the resolved plan, as the job reads it from its run directory (plan.json). In this process, with no CUDA
and no real storage for the model: a fake process group of the plan's world at the rank
of pipeline stage STAGE and context-parallel rank CP_RANK (tp and dp index 0; fake_world
says why one rank stands for its peers), the job's own Trainer built for the plan's machine (its GPU: bf16, the
planned kernels) under FakeTensorMode -- model chunks, LoRA, freezes, lr groups, DDP,
megatron's optimizer -- then the optimizer's first step on zeroed gradients (it makes
the optimizer's state, as the job's first step does) and one measured step of megatron's
pipeline schedule on micro-batches of the plan's shapes, made by the job's collate: the
memory of every step after the first. (A whole first step measured the same, at a
third more of the probe's time.) OUT_JSON: parameters and peak
memory by category (live_memory), what stood in for what (stand_ins), timings.

Micro-batches per step: the fewest with which every stage holds as many at once, model
chunk by model chunk, as with the plan's (estimate.probe_microbatches, from megatron's
schedule: 1F1B holds at most `pp - stage`).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

AUDIO_TOKEN_ID = 7  # any id below the vocabulary: the probe has no tokenizer, and values do not matter


def synthetic_microbatch(cfg) -> dict:
    """A micro-batch of the plan's shapes through the job's collate: micro_batch_size rows
    of data.seq_length tokens, each packed with as many samples as it holds clips of
    data.max_audio_seconds (estimate.clips_in_a_row), every sample one clip's placeholders
    and trained text."""
    from orchestrator.data.frames import HOP_LENGTH
    from orchestrator.data.packing import Example, collate
    from orchestrator.data.prompts import Tokenized
    from orchestrator.plan.estimate import clips_in_a_row
    from orchestrator.plan.model_params import audio_tokens_per_clip, clip_read_frames

    data, model = cfg.data, cfg.model
    placeholders = audio_tokens_per_clip(data.max_audio_seconds, model, data.audio_tokens)
    clips = clips_in_a_row(cfg)
    ctc = float(model.adapter.ctc_weight) > 0
    rows = []
    for row in range(cfg.optim.micro_batch_size):
        samples = []
        for k in range(clips):  # the row's tokens shared out, the first samples one longer where they do not divide
            length = data.seq_length // clips + (k < data.seq_length % clips)
            tokens = np.full(length, 11, dtype=np.int64)
            tokens[1:1 + placeholders] = AUDIO_TOKEN_ID
            loss_mask = np.zeros(length, dtype=np.float32)
            loss_mask[1 + placeholders:] = 1.0
            tokenized = Tokenized(tokens, np.full(length, 12, dtype=np.int64), loss_mask, [placeholders],
                                  answer_start=1 + placeholders, ctc=ctc)
            samples.append(Example(position=row * clips + k, dataset_id=0, tokenized=tokenized))
        rows.append(samples)
    window = 2 * model.encoder.max_source_positions
    mel = clip_read_frames(data.max_audio_seconds, model, data.audio_tokens)  # the lengths the loader sends

    def features(examples):  # what the loader sends: log-mel, or the waveforms of data.features_on=device
        count = sum(len(ex.tokenized.audio_tokens) for ex in examples)
        audio = {"audio_lengths": torch.full((count,), mel, dtype=torch.long)}
        if data.features_on == "device":
            return {**audio, "audio_waveforms": torch.zeros(count, mel * HOP_LENGTH),
                    "audio_mel_bins": model.encoder.num_mel_bins, "audio_window_frames": window}
        return {**audio, "audio_features": torch.zeros(count, model.encoder.num_mel_bins, window)}

    return collate(rows, data.seq_length, 0, ["probe"], AUDIO_TOKEN_ID, features_fn=features, packed=data.packing)


class RepeatedBatches:
    """BatchSource: the same micro-batch again and again."""

    dataset_names = ["probe"]

    def __init__(self, batch: dict):
        self.batch = batch

    def next_microbatch(self) -> dict:
        return self.batch

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def sample_counts(self) -> dict:
        return {}


def _probe_plan(plan_json: Path):
    """The plan, as the probe runs it: no init checkpoint (the weights are fake), the
    step's micro-batches capped (probe_microbatches), the layers compiled where the job
    compiles them and this torch allows it under the probe's modes (probe/compiled.py),
    eager otherwise."""
    from orchestrator.plan.estimate import probe_microbatches
    from orchestrator.plan.resolved import Plan

    plan = Plan.from_dict(json.loads(plan_json.read_text()), plan_json.parent, source=str(plan_json))
    plan.config["model"]["init_checkpoint"] = None
    from orchestrator.probe.compiled import supported

    if not supported():
        plan.config["model"]["compile"] = "none"
    plan.num_microbatches = probe_microbatches(plan.dims.pp, plan.dims.vpp, plan.num_microbatches)
    return plan


def _target_machine(plan):
    """The machine the plan is for: its GPU (TransformerEngine where the plan's backend
    wants it; no apex) or a CPU."""
    from orchestrator.runtime.machine import Machine

    gpu = plan.section("launcher").get("accelerator", "gpu") == "gpu"
    return Machine(cuda=gpu, transformer_engine=gpu and plan.section("model").get("backend") == "te",
                   apex_gradient_fusion=False)


def probe_role(plan_json: Path, stage: int, cp_rank: int = 0, fake: bool = True) -> dict:
    """`fake=False` runs the same step on real tensors (a small model on this CPU: the
    tests' check that the fake step counts what a real one holds)."""
    started = time.perf_counter()
    from torch._subclasses.fake_tensor import FakeTensorMode

    from orchestrator.probe import stand_ins
    from orchestrator.probe.fake_world import init_fake_world, rank_of
    from orchestrator.probe.host_tensors import RealOnRealInputs
    from orchestrator.probe.live_memory import LiveMemory
    from orchestrator.probe.trainer import ProbeTrainer
    from orchestrator.train.audiollm_provider import AudioLLMProvider, audiollm_config, for_context_parallel
    from orchestrator.train.loop import Components

    plan = _probe_plan(plan_json)
    cfg = audiollm_config(plan)
    dims = plan.dims
    rank = rank_of(stage, cp_rank, dims)
    init_fake_world(rank, dims, plan.seed)
    machine = _target_machine(plan)
    stand_in_lines = stand_ins.install(cfg.model.backend) if machine.cuda else []
    stand_in_lines += stand_ins.skip_value_reads() + stand_ins.fake_tensor_limits()
    provider = AudioLLMProvider.with_ids(plan, AUDIO_TOKEN_ID, cfg=cfg)
    batch = synthetic_microbatch(cfg)
    components = Components(provider=provider, train_source=for_context_parallel(RepeatedBatches(batch), dims))
    memory = LiveMemory()
    timings = {}
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with fake_mode, memory, RealOnRealInputs(memory):
        t = time.perf_counter()
        trainer = ProbeTrainer(plan, components, "cpu", machine=machine)
        if fake:
            trainer.fake_forward(fake_mode)
        timings["build_s"] = time.perf_counter() - t
        memory.sort_setup(trainer.weights(), trainer.grad_buffers())
        trainer.track_modules(memory)
        t = time.perf_counter()
        trainer.probe_step(memory, forward_backward=False)
        timings["optimizer_state_s"] = time.perf_counter() - t
        memory.reset_peak()
        t = time.perf_counter()
        trainer.probe_step(memory)
        timings["step_s"] = time.perf_counter() - t
        measured = memory.snapshot()
    params = trainer.parameter_counts()
    return {
        "stage": stage, "cp_rank": cp_rank, "rank": rank, "world_size": dims.world_size,
        "microbatches_per_step": plan.num_microbatches, "decisions": list(trainer.decisions.lines),
        "compiled": trainer.decisions.compile, "compiled_graphs": trainer.compiled_graphs,
        "stand_ins": stand_in_lines, "parameters": params, "memory": measured,
        "timings": {**timings, "total_s": time.perf_counter() - started},
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# What a role imports as it builds and steps its model, beyond this module's own imports:
# with those, about 6 s of a role's CPU (a tiny role then probes in 3 s, a full-size one
# in 15). A process that probes many roles (probe/forks.py) imports them once.
PRELOADED = ("torch._subclasses.fake_tensor", "torch._dynamo.backends.common", "torch._inductor.compile_fx",
             "transformers.models.whisper.modeling_whisper", "orchestrator.models.audiollm",
             "orchestrator.plan.estimate", "orchestrator.probe.stand_ins", "orchestrator.probe.trainer",
             "orchestrator.train.audiollm_provider")


def preload() -> None:
    """Import PRELOADED before the probe's modes are on, as the job imports them before it
    builds: a tensor a module makes at import (megatron's multi_token_prediction makes a
    4-byte scalar as it defines MTPLossAutoScaler) is then no part of the step's memory,
    whether the role runs in a process of its own or forked from one that imported them
    (probe/forks.py)."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # The probe is a CPU process whatever machine runs it: its tensors are fake CPU ones
    # that megatron takes for CUDA ones only through the CPU layer (runtime/cpu_compat.py),
    # which stays off where CUDA is visible. On a GPU machine megatron's optimizer then
    # refused the probe's "torch.BFloat16Tensor" parameters; hidden before anything asks
    # torch about CUDA, the GPU is not seen and the probe runs as on a CPU machine.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    real = "--real" in argv
    argv = [a for a in argv if a != "--real"]
    if len(argv) != 4:
        print("usage: python -m orchestrator.probe.role PLAN_JSON STAGE CP_RANK OUT_JSON [--real]", file=sys.stderr)
        return 2
    preload()
    result = probe_role(Path(argv[0]), int(argv[1]), int(argv[2]), fake=not real)
    Path(argv[3]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
