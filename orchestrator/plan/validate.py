"""Every rule a run must satisfy, checked before anything is queued.

Megatron-LM checks most of these in `validate_args` on every rank after the job
has started; here they run on the submit side, all at once, and each message names
every value involved and how to fix it. `validate(cfg)` returns all findings;
`check(cfg)` raises ConfigInvalid when any is an error.

Each rule is a small function of the config sections it needs, yielding Findings.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from orchestrator.plan.decoder_families import FAMILIES, PROMPTS, prompt_settings
from orchestrator.plan.checkpoint_dirs import frozen_source_problem, layout_text, resolve_model_checkpoint
from orchestrator.plan.kernels import ATTENTION_CHOICES, COMPILE_CHOICES, ENCODER_PRECISIONS, compile_blockers
from orchestrator.plan.schema import (
    AudioLLMConfig,
    DataConfig,
    LauncherConfig,
    LoggerConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    RunConfig,
    TrainConfig,
)
from orchestrator.plan.local_paths import index_columns, inside, local_dataset_dirs, missing_inputs
from orchestrator.plan.model_params import audio_tokens_per_clip
from orchestrator.plan.parallel_dims import ParallelDims, canonical_nodes_problem, world_size as launcher_world
from orchestrator.plan.topology import RANK_ORDERS
from orchestrator.plan.wandb_settings import WANDB_MODES
from orchestrator.plan import checkpoint_model, tasks

ERROR = "error"
WARNING = "warning"

# Decoder linears that can carry LoRA adapters (megatron-core module names).
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


@dataclass(frozen=True)
class Finding:
    severity: str  # error | warning
    rule: str  # short identifier, stable for tests and scripts
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: [{self.rule}] {self.message}"


class ConfigInvalid(ValueError):
    def __init__(self, findings: list[Finding]):
        self.findings = findings
        errors = [f for f in findings if f.severity == ERROR]
        super().__init__(
            f"{len(errors)} configuration error(s), nothing was submitted:\n" + "\n".join(f"  {f}" for f in errors)
        )


def _error(rule: str, message: str) -> Finding:
    return Finding(ERROR, rule, message)


def _warning(rule: str, message: str) -> Finding:
    return Finding(WARNING, rule, message)


def _one_of(rule: str, key: str, value, allowed: Iterable) -> Iterator[Finding]:
    allowed = tuple(allowed)
    if value not in allowed:
        yield _error(rule, f"{key}={value!r} is not one of {', '.join(repr(a) for a in allowed)}")


def _positive(rule: str, **values) -> Iterator[Finding]:
    for key, value in values.items():
        if value is None or value < 1:
            yield _error(rule, f"{key}={value} must be a positive integer")


def world_size(launcher: LauncherConfig) -> int:
    return launcher_world(launcher.nodes, launcher.gpus_per_node)


def model_parallel_size(parallel: ParallelConfig) -> int:
    return parallel.tp * parallel.pp * parallel.cp


def parallel_dims(parallel: ParallelConfig, launcher: LauncherConfig) -> ParallelDims:
    """The run's sizes; dp None where tp x pp x cp does not tile the launcher's ranks
    (check_world_size says so)."""
    dims = ParallelDims.of(parallel)
    world = world_size(launcher)
    return dims if ParallelDims.world_problem(dims.tp, dims.pp, dims.cp, world, "") else dims.at_world(world)


# --------------------------------------------------------------------------- topology
def check_sizes(parallel: ParallelConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    yield from _positive(
        "sizes",
        **{
            "parallel.tp": parallel.tp,
            "parallel.pp": parallel.pp,
            "parallel.cp": parallel.cp,
            "launcher.nodes": launcher.nodes,
            "launcher.gpus_per_node": launcher.gpus_per_node,
        },
    )
    if parallel.vpp is not None and parallel.vpp < 1:
        yield _error("sizes", f"parallel.vpp={parallel.vpp} must be a positive integer or null")


def check_world_size(parallel: ParallelConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    world, mp = world_size(launcher), model_parallel_size(parallel)
    if world < 1 or mp < 1:
        return
    problem = ParallelDims.world_problem(
        parallel.tp, parallel.pp, parallel.cp, world,
        f"launcher.nodes {launcher.nodes} x launcher.gpus_per_node {launcher.gpus_per_node}")
    if problem:
        yield _error("world_size", problem)


def check_rank_order(parallel: ParallelConfig) -> Iterator[Finding]:
    yield from _one_of("rank_order", "parallel.rank_order", parallel.rank_order, RANK_ORDERS)


def check_heads(parallel: ParallelConfig, model: ModelConfig) -> Iterator[Finding]:
    dec, tp = model.decoder, parallel.tp
    if tp < 1:
        return
    if dec.num_attention_heads % tp:
        yield _error(
            "heads_tp",
            f"model.decoder.num_attention_heads ({dec.num_attention_heads}) is not divisible by parallel.tp ({tp}); "
            f"use a tp that divides {dec.num_attention_heads}",
        )
    if dec.num_query_groups % tp:
        yield _error(
            "kv_heads_tp",
            f"model.decoder.num_query_groups ({dec.num_query_groups} KV heads) is not divisible by parallel.tp ({tp}); "
            f"use a tp that divides {dec.num_query_groups}",
        )
    if dec.num_query_groups < 1 or dec.num_attention_heads % max(dec.num_query_groups, 1):
        yield _error(
            "gqa",
            f"model.decoder.num_attention_heads ({dec.num_attention_heads}) is not a multiple of "
            f"model.decoder.num_query_groups ({dec.num_query_groups})",
        )


def check_layers(parallel: ParallelConfig, model: ModelConfig) -> Iterator[Finding]:
    layers, pp, vpp = model.decoder.num_layers, parallel.pp, parallel.vpp
    if pp < 1:
        return
    if layers % pp:
        yield _error(
            "layers_pp",
            f"model.decoder.num_layers ({layers}) is not divisible by parallel.pp ({pp}); "
            f"use a pp that divides {layers}",
        )
    if vpp is not None and vpp >= 1:
        if pp == 1:
            yield _error("vpp_needs_pp", f"parallel.vpp ({vpp}) needs parallel.pp > 1 (pp is {pp}); set parallel.vpp=null")
        elif layers % (pp * vpp):
            yield _error(
                "layers_vpp",
                f"model.decoder.num_layers ({layers}) is not divisible by parallel.pp ({pp}) x parallel.vpp ({vpp}) "
                f"= {pp * vpp}; each virtual stage needs the same number of layers",
            )


def check_sequence(parallel: ParallelConfig, data: DataConfig, model: ModelConfig) -> Iterator[Finding]:
    seq, cp, tp = data.seq_length, parallel.cp, parallel.tp
    if seq < 1:
        yield _error("seq_length", f"data.seq_length={seq} must be positive")
        return
    if cp > 1 and seq % (2 * cp):
        yield _error(
            "seq_cp",
            f"data.seq_length ({seq}) is not divisible by 2 x parallel.cp ({cp}) = {2 * cp}: context parallel "
            f"splits each sequence into 2*cp load-balanced chunks; use a multiple of {2 * cp}",
        )
    if parallel.sp and tp > 1 and seq % tp:
        yield _error(
            "seq_sp",
            f"data.seq_length ({seq}) is not divisible by parallel.tp ({tp}) with parallel.sp=true: sequence "
            f"parallel splits the sequence over TP ranks; use a multiple of {tp}",
        )
    if seq > model.decoder.max_position_embeddings:
        yield _error(
            "seq_positions",
            f"data.seq_length ({seq}) exceeds model.decoder.max_position_embeddings "
            f"({model.decoder.max_position_embeddings})",
        )


def check_sequence_parallel(parallel: ParallelConfig) -> Iterator[Finding]:
    if parallel.sp and parallel.tp <= 1:
        yield _error(
            "sp_needs_tp",
            f"parallel.sp=true needs parallel.tp > 1 (tp is {parallel.tp}); set parallel.sp=false or raise tp",
        )


def check_context_parallel(parallel: ParallelConfig, data: DataConfig) -> Iterator[Finding]:
    """Context parallelism splits every row into 2*cp chunks (orchestrator.data.context_parallel);
    with sequence parallelism each rank's share is split again over the TP ranks."""
    cp, tp, seq = parallel.cp, parallel.tp, data.seq_length
    if cp > 1 and parallel.sp and seq % (2 * cp * tp):
        yield _error(
            "seq_cp_sp",
            f"data.seq_length ({seq}) is not divisible by 2 x parallel.cp ({cp}) x parallel.tp ({tp}) = "
            f"{2 * cp * tp} with parallel.sp=true: each context-parallel rank holds 2 chunks of every row and "
            f"sequence parallel splits those over the TP ranks; use a multiple of {2 * cp * tp}",
        )


def check_batch(parallel: ParallelConfig, launcher: LauncherConfig, optim: OptimConfig) -> Iterator[Finding]:
    yield from _positive(
        "batch", **{"optim.global_batch_size": optim.global_batch_size, "optim.micro_batch_size": optim.micro_batch_size}
    )
    world, mp = world_size(launcher), model_parallel_size(parallel)
    if world < 1 or mp < 1 or world % mp or optim.micro_batch_size < 1 or optim.global_batch_size < 1:
        return
    dims = parallel_dims(parallel, launcher)
    dp = dims.dp
    problem = dims.batch_problem(optim.global_batch_size, optim.micro_batch_size)
    if problem:
        yield _error("global_batch", problem)
        return
    microbatches = dims.microbatches(optim.global_batch_size, optim.micro_batch_size)
    if parallel.pp > 1 and microbatches < parallel.pp:
        yield _warning(
            "pipeline_bubble",
            f"{microbatches} micro-batches per step (optim.global_batch_size {optim.global_batch_size} / "
            f"(optim.micro_batch_size {optim.micro_batch_size} x DP {dp})) is fewer than parallel.pp ({parallel.pp}): "
            f"the pipeline idles most of each step; raise the global batch or lower the micro batch",
        )
    if parallel.vpp and parallel.pp > 1 and microbatches % parallel.pp:
        yield _error(
            "vpp_microbatches",
            f"the interleaved schedule (parallel.vpp={parallel.vpp}) needs the number of micro-batches "
            f"({microbatches}) to be a multiple of parallel.pp ({parallel.pp})",
        )


def layout_change(saved: dict, plan: dict) -> tuple[str | None, list]:
    """(a line saying how this plan's layout differs from the checkpoint's, or None when
    it does not; the reasons it cannot continue there). `plan`: the resolved plan."""
    now = {k: plan[k] for k in ("tp", "pp", "cp", "dp")}
    before = {k: saved.get(k) for k in now}
    if before == now:
        return None, []
    errors = []
    nodes = saved.get("canonical_nodes")
    configured = plan["config"]["data"].get("canonical_nodes")
    if nodes:
        problem = canonical_nodes_problem(nodes, now["dp"], fixed=True, configured=configured)
        if problem:
            errors.append(problem)
    if saved.get("optimizer") == "dp_reshardable" and any(before[k] != now[k] for k in ("tp", "pp", "cp")):
        errors.append(f"the checkpoint's distributed-optimizer state (megatron's dp_reshardable layout) loads at "
                      f"another data-parallel size only: keep TP {before['tp']} PP {before['pp']} CP {before['cp']} "
                      f"(runs without parallel.distributed_optimizer also change TP, PP and CP)")
    share = f"; each data-parallel rank reads {nodes // now['dp']} of its {nodes} canonical nodes" \
        if nodes and not errors else ""
    return f"continues at another size: {layout_text(before)} -> {layout_text(now)}{share}", errors


def check_canonical_nodes(parallel: ParallelConfig, launcher: LauncherConfig, data: DataConfig,
                          optim: OptimConfig) -> Iterator[Finding]:
    nodes = data.canonical_nodes
    if nodes is None:
        return
    world, mp = world_size(launcher), model_parallel_size(parallel)
    if nodes < 1 or world < 1 or mp < 1 or world % mp:
        yield from _positive("canonical_nodes", **{"data.canonical_nodes": nodes})
        return
    problem = canonical_nodes_problem(nodes, world // mp, fixed=False)
    if problem:
        yield _error("canonical_nodes", problem)
    elif optim.micro_batch_size > 0 and optim.global_batch_size % (optim.micro_batch_size * nodes):
        yield _warning("canonical_nodes",
                       f"optim.global_batch_size ({optim.global_batch_size}) is not a multiple of "
                       f"optim.micro_batch_size ({optim.micro_batch_size}) x data.canonical_nodes ({nodes}): "
                       f"a run continued at another data-parallel size reads every sample once, but its steps "
                       f"group the micro-batches differently from a run at the first size")


def check_recompute(parallel: ParallelConfig, model: ModelConfig) -> Iterator[Finding]:
    rc = parallel.recompute
    yield from _one_of("recompute", "parallel.recompute.granularity", rc.granularity, (None, "full", "selective"))
    if rc.granularity == "full":
        yield from _one_of("recompute", "parallel.recompute.method", rc.method, ("uniform", "block"))
        if rc.num_layers is None or rc.num_layers < 1:
            yield _error(
                "recompute",
                f"parallel.recompute.granularity=full needs parallel.recompute.num_layers >= 1 (got {rc.num_layers})",
            )
        elif parallel.pp >= 1:
            per_stage = model.decoder.num_layers // max(parallel.pp * (parallel.vpp or 1), 1)
            if rc.num_layers > per_stage:
                yield _error(
                    "recompute",
                    f"parallel.recompute.num_layers ({rc.num_layers}) exceeds the {per_stage} decoder layers per "
                    f"pipeline stage (model.decoder.num_layers {model.decoder.num_layers} / parallel.pp {parallel.pp}"
                    f"{' / parallel.vpp ' + str(parallel.vpp) if parallel.vpp else ''})",
                )
    elif rc.granularity == "selective":
        if rc.method is not None or rc.num_layers is not None:
            yield _error(
                "recompute",
                f"parallel.recompute.granularity=selective takes no method/num_layers (got method={rc.method}, "
                f"num_layers={rc.num_layers}); set them to null",
            )
    elif rc.method is not None or rc.num_layers is not None:
        yield _error(
            "recompute",
            f"parallel.recompute.method={rc.method} / num_layers={rc.num_layers} are set but "
            f"parallel.recompute.granularity is null; set granularity=full or clear them",
        )


def check_distributed_optimizer(parallel: ParallelConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    # megatron shards the optimizer state over the data x context parallel ranks.
    mp = model_parallel_size(parallel)
    if parallel.distributed_optimizer and mp >= 1 and world_size(launcher) // mp * parallel.cp == 1:
        yield _warning(
            "distributed_optimizer",
            "parallel.distributed_optimizer=true with data-parallel size 1 (and parallel.cp=1) shards nothing",
        )


# --------------------------------------------------------------------------- model
def _ordinal(n: int) -> str:
    """2 -> "2nd", 6 -> "6th"."""
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th") if n % 100 not in (11, 12, 13) else "th"
    return f"{n}{suffix}"


def check_decoder(model: ModelConfig) -> Iterator[Finding]:
    dec = model.decoder
    yield from _positive(
        "decoder",
        **{
            "model.decoder.hidden_size": dec.hidden_size,
            "model.decoder.num_layers": dec.num_layers,
            "model.decoder.num_attention_heads": dec.num_attention_heads,
            "model.decoder.num_query_groups": dec.num_query_groups,
            "model.decoder.kv_channels": dec.kv_channels,
            "model.decoder.ffn_hidden_size": dec.ffn_hidden_size,
            "model.decoder.vocab_size": dec.vocab_size,
        },
    )
    if dec.family not in FAMILIES:
        yield _error("decoder", f"model.decoder.family={dec.family!r} is not one of {sorted(FAMILIES)}")
        return
    family = FAMILIES[dec.family]
    # What another family's layer has and this one's has not: refused, not ignored.
    applies = {"sliding_window": family.sliding_window, "query_pre_attn_scalar": family.query_pre_attn_scalar,
              "attn_logit_softcap": family.softcaps, "final_logit_softcap": family.softcaps,
              "rope_scaling_factor": family.rope_scaling is not None, "rope_local_theta": family.local_rope}
    for key, used in applies.items():
        if not used and getattr(dec, key) is not None:
            yield _error("decoder", f"model.decoder.{key}={getattr(dec, key)} does not apply to the "
                                    f"{dec.family} decoder family: set it to null (model.decoder.{key}=null)")
    for key, used in applies.items():
        value = getattr(dec, key)
        if used and value is not None and value <= 0:
            yield _error("decoder", f"model.decoder.{key}={value} must be positive or null (none)")
    if family.local_rope and dec.rope_local_theta is None:
        yield _error("decoder", f"model.decoder.rope_local_theta is null: the {dec.family} family's sliding-window "
                                f"layers rotate with their own RoPE base (Gemma 3: 10000, HF rope_local_base_freq)")
    if family.sliding_window and dec.sliding_window is None:
        yield _error("decoder", f"model.decoder.sliding_window is null: the {dec.family} family's layers attend within "
                                f"a window on all but every {_ordinal(family.window_pattern)} layer (HF sliding_window: 4096 "
                                f"for Gemma 2, 1024 for Gemma 3 from 4b up); without it every layer attends "
                                f"globally, which is another model: set model.decoder.sliding_window")
    elif family.sliding_window and dec.num_layers < family.window_pattern:
        yield _error("decoder", f"model.decoder.num_layers={dec.num_layers} but the {dec.family} family's global "
                                f"layer is every {_ordinal(family.window_pattern)} (HF layer_types): with fewer layers every "
                                f"layer is windowed and none attends globally; use at least {family.window_pattern} "
                                f"layers")
    if family.query_pre_attn_scalar and dec.query_pre_attn_scalar is None:
        yield _error("decoder", f"model.decoder.query_pre_attn_scalar is null: the {dec.family} family scales "
                                f"queries by it (Gemma2: 256 at 2b and 9b, HF query_pre_attn_scalar)")


def check_encoder(model: ModelConfig) -> Iterator[Finding]:
    enc, adapter = model.encoder, model.adapter
    yield from _positive(
        "encoder",
        **{
            "model.encoder.d_model": enc.d_model,
            "model.encoder.num_layers": enc.num_layers,
            "model.encoder.num_heads": enc.num_heads,
            "model.encoder.ffn_dim": enc.ffn_dim,
            "model.encoder.max_source_positions": enc.max_source_positions,
            "model.adapter.frame_stack": adapter.frame_stack,
        },
    )
    if enc.num_heads >= 1 and enc.d_model % enc.num_heads:
        yield _error(
            "encoder",
            f"model.encoder.d_model ({enc.d_model}) is not divisible by model.encoder.num_heads ({enc.num_heads})",
        )
    yield from _one_of("encoder", "model.encoder.num_mel_bins", enc.num_mel_bins, (80, 128))
    if adapter.frame_stack >= 1 and enc.max_source_positions % adapter.frame_stack:
        yield _error(
            "adapter",
            f"model.encoder.max_source_positions ({enc.max_source_positions}) is not divisible by "
            f"model.adapter.frame_stack ({adapter.frame_stack}): the adapter would drop the last frames of a "
            f"full window",
        )
    if not 0.0 <= adapter.dropout < 1.0:
        yield _error("adapter", f"model.adapter.dropout={adapter.dropout} must be in [0, 1)")
    if adapter.ctc_weight < 0:
        yield _error("adapter", f"model.adapter.ctc_weight={adapter.ctc_weight} must be >= 0 (0: no CTC head)")


def check_init_checkpoint(model: ModelConfig, lora: LoraConfig) -> Iterator[Finding]:
    """The pretrained weights exist and are a checkpoint; nothing is frozen at its
    random initial value (a frozen random encoder is never what anyone means)."""
    if model.init_checkpoint:
        path, problem = resolve_model_checkpoint(model.init_checkpoint)
        problem = problem or frozen_source_problem(Path(path))
        if problem:
            yield _error("init_checkpoint", f"model.init_checkpoint={model.init_checkpoint}: {problem}")
            return
        other = checkpoint_model.mismatches(model, Path(path))
        if other:  # the job would stop loading it, after the queue
            yield _error("init_checkpoint", f"model.init_checkpoint={model.init_checkpoint} holds another model: "
                                            f"{'; '.join(other)}. Point it at weights of this model, or choose the "
                                            f"model config (and its family and shapes) the checkpoint was made for")
        return
    frozen = [f"model.{part}.freeze=true" for part in ("encoder", "adapter", "decoder")
              if getattr(model, part).freeze]
    if lora.rank > 0:
        frozen.append(f"lora.rank={lora.rank} (LoRA freezes the adapted decoder weights)")
    if frozen and model.allow_frozen_random:
        yield _warning("frozen_random", f"{', '.join(frozen)} with random weights (model.init_checkpoint is null, "
                                        f"model.allow_frozen_random=true): for measuring speed and memory only, the "
                                        f"losses mean nothing")
    elif frozen:
        yield _error("frozen_random", f"{', '.join(frozen)} but model.init_checkpoint is null: frozen weights would "
                                      f"stay at their random initial values; set model.init_checkpoint to pretrained "
                                      f"weights (`audiollm convert hf-to-megatron --hf HF_DECODER_DIR --whisper "
                                      f"WHISPER_DIR --out DIR`), or unfreeze to train from scratch "
                                      f"(model.encoder.freeze=false, lora=none), or to measure speed and memory only "
                                      f"set model.allow_frozen_random=true")


def check_trained_encoder_precision(model: ModelConfig, lora: LoraConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    """A GPU run trains in bf16: megatron's bf16 optimizer keeps the fp32 master weights of
    bf16 parameters and holds and checkpoints no fp32 ones, so an encoder that trains
    (unfrozen, or adapted by LoRA) cannot be kept in fp32 there."""
    trains = not model.encoder.freeze or (lora.rank > 0 and lora.encoder)
    if model.encoder.precision == "fp32" and trains and launcher.accelerator == "gpu":
        how = "model.encoder.freeze=false" if not model.encoder.freeze else f"lora.encoder=true (lora.rank={lora.rank})"
        yield _error("encoder_precision",
                     f"model.encoder.precision=fp32 with a trained encoder ({how}) on launcher.accelerator=gpu: a GPU "
                     f"run trains in bf16, and megatron's bf16 optimizer keeps fp32 master weights of bf16 "
                     f"parameters only; use model.encoder.precision=auto (bf16 on GPUs), or freeze the encoder "
                     f"to keep it in fp32")


def check_backend(model: ModelConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    yield from _one_of("backend", "model.backend", model.backend, ("local", "te"))
    if model.backend == "te" and launcher.accelerator == "cpu":
        yield _error(
            "backend",
            "model.backend=te (TransformerEngine) needs GPUs but launcher.accelerator=cpu; use model.backend=local",
        )
    yield from _one_of("encoder_precision", "model.encoder.precision", model.encoder.precision, ENCODER_PRECISIONS)
    if model.encoder.precision == "bf16" and launcher.accelerator == "cpu":
        yield _error("encoder_precision", "model.encoder.precision=bf16 runs on GPUs but launcher.accelerator=cpu; "
                                          "use model.encoder.precision=auto or fp32")
    yield from _one_of("attention", "model.attention", model.attention, ATTENTION_CHOICES)
    if model.attention == "flex" and launcher.accelerator == "cpu":
        yield _error(
            "attention",
            "model.attention=flex (torch's flex_attention) has no backward on CPU but launcher.accelerator=cpu; "
            "use model.attention=reference (or auto, which picks reference on CPU and flex on GPUs)",
        )
    if model.fp8 is not None:
        yield from _one_of("fp8", "model.fp8", model.fp8, ("hybrid", "e4m3"))
        if model.backend != "te" or launcher.accelerator != "gpu":
            yield _error("fp8", f"model.fp8={model.fp8} runs in TransformerEngine's linears on GPUs, but model.backend="
                                f"{model.backend} and launcher.accelerator={launcher.accelerator}; set model.fp8=null, or "
                                "model.backend=te with launcher.accelerator=gpu")


def check_compile(model: ModelConfig, parallel: ParallelConfig) -> Iterator[Finding]:
    """model.compile=layers where the compiled layer cannot go (auto leaves those layouts
    eager by itself)."""
    yield from _one_of("compile", "model.compile", model.compile, COMPILE_CHOICES)
    if model.compile != "layers":
        return
    for setting, reason, fix in compile_blockers(model.backend, parallel.recompute.granularity):
        yield _error("compile", f"model.compile=layers with {setting}: {reason}; use {fix}, or model.compile=auto "
                                f"(compiles where it can) or none")


# --------------------------------------------------------------------------- data
# mosaic's size format (streaming.base.util.bytes_to_int), checked here without importing it.
_CACHE_LIMIT = re.compile(r"^\s*\d+(\.\d+)?\s*(b|kb|mb|gb|tb|pb)?\s*$", re.IGNORECASE)


def check_data(data: DataConfig, model: ModelConfig, purpose: str) -> Iterator[Finding]:
    yield from _one_of("data", "data.on_bad_sample", data.on_bad_sample, ("error", "skip"))
    yield from _one_of("data", "data.long_audio", data.long_audio, ("refuse", "chunk"))
    yield from _one_of("data", "data.audio_tokens", data.audio_tokens, ("clip", "window"))
    yield from _one_of("data", "data.wrong_sample_rate", data.wrong_sample_rate, ("resample", "refuse"))
    yield from _one_of("data", "data.features_on", data.features_on, ("cpu", "device"))
    if not 0.0 <= data.max_bad_fraction <= 1.0:
        yield _error("data", f"data.max_bad_fraction={data.max_bad_fraction} must be between 0 and 1 (a share of "
                             f"a dataset's samples; 0.01 stops the run when over 1% of one dataset is bad)")
    if data.num_workers < 0:
        yield _error("data_workers", f"data.num_workers={data.num_workers} must be >= 0 "
                                     f"(0 decodes in the training process)")
    if data.cache_limit is not None and not _CACHE_LIMIT.match(str(data.cache_limit)):
        yield _error("data", f"data.cache_limit={data.cache_limit!r} is not a size: use bytes or a number with "
                             f"kb, mb, gb or tb (e.g. 200gb), or null for no limit")
    if data.download_retry < 0:
        yield _error("data", f"data.download_retry={data.download_retry} must be >= 0")
    if data.demo_corpus and data.demo_corpus_samples < 1:
        yield _error("data", f"data.demo_corpus_samples={data.demo_corpus_samples} must be >= 1 "
                             f"(training utterances written into data.demo_corpus={data.demo_corpus})")
    if data.feature_cache_mb < 0:
        yield _error("data", f"data.feature_cache_mb={data.feature_cache_mb} must be >= 0 (0 disables the cache)")
    if data.max_audio_seconds <= 0:
        yield _error("data", f"data.max_audio_seconds={data.max_audio_seconds} must be positive")
        return
    window_seconds = model.encoder.max_source_positions * 2 / 100
    if data.max_audio_seconds > window_seconds:
        yield _error(
            "audio_window",
            f"data.max_audio_seconds ({data.max_audio_seconds}) exceeds the encoder window of {window_seconds:g} s "
            f"(model.encoder.max_source_positions {model.encoder.max_source_positions} x 2 / 100 frames per s); "
            f"lower data.max_audio_seconds or use data.long_audio=chunk with max_audio_seconds <= {window_seconds:g}",
        )
    if model.adapter.frame_stack >= 1:
        # "window" counts every clip as a full encoder window, whatever its length.
        seconds = window_seconds if data.audio_tokens == "window" else min(data.max_audio_seconds, window_seconds)
        audio_tokens = audio_tokens_per_clip(seconds, model)
        if audio_tokens >= data.seq_length:
            yield _error(
                "audio_tokens",
                f"a {seconds:g}-s clip (data.audio_tokens={data.audio_tokens}) becomes {audio_tokens} audio tokens, not fewer than "
                f"data.seq_length ({data.seq_length}): no room for the prompt and the response",
            )
    if "<SpeechHere>" not in data.prompt_template:
        yield _error("prompt", "data.prompt_template has no <SpeechHere> marker for the audio")
    yield from _one_of("data", "data.long_conversation", data.long_conversation, ("refuse", "truncate"))
    for split in ("train", "validation"):
        for entry in getattr(data, split):
            for problem in tasks.entry_problems(entry, data, split):
                yield _error("dataset_format", problem)
    if not data.train:
        finding = _error if purpose == "train" else _warning
        yield finding("no_train_data", "data.train lists no datasets; add at least one {name, path, weight}")
    names = [d.name for d in list(data.train) + list(data.validation)]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        yield _error("dataset_names", f"dataset names must be unique; repeated: {', '.join(duplicates)}")
    for entry in data.train:
        if entry.weight <= 0:
            yield _error("dataset_weight", f"data.train[{entry.name}].weight={entry.weight} must be positive")


# --------------------------------------------------------------------------- optimizer and loop
# What a chat format's turn markers look like: <start_of_turn>, <|im_start|>, </s>.
_TURN_MARKER = re.compile(r"</?\|?[A-Za-z_][A-Za-z0-9_]*\|?>")


def check_tokenizer(data: DataConfig, model: ModelConfig, purpose: str = "plan") -> Iterator[Finding]:
    """There is a tokenizer (every job tokenizes its text: without one it would stop at
    start, on the cluster); a local HF tokenizer (its tokenizer.json, read as JSON: no
    transformers here) knows data.audio_token as one token and fits the model's
    vocabulary. A tokenizer not written yet (the demo corpus is made by `audiollm train`)
    is checked by the job."""
    from orchestrator.plan.tokenizer_file import TokenizerFileError, read_special_tokens, read_vocabulary

    if not data.tokenizer:
        finding = _error if purpose == "train" else _warning
        yield finding("tokenizer", f"data.tokenizer is unset, and every job tokenizes its prompts and answers with "
                                   f"it: set data.tokenizer to the model's own tokenizer, a local HF directory with "
                                   f"tokenizer.json (for model {model.name}: its HF decoder's directory, the "
                                   f"one `audiollm convert hf-to-megatron --hf` read, or the directory `audiollm convert megatron-to-hf` "
                                   f"wrote)")
        return
    try:
        vocab = read_vocabulary(data.tokenizer)
        specials = read_special_tokens(data.tokenizer)
    except FileNotFoundError:
        yield from _prompt_of_another_family(data, model)
        return
    except TokenizerFileError as exc:
        yield _error("tokenizer", f"data.tokenizer={data.tokenizer}: {exc}")
        return
    family = model.decoder.family if model.decoder.family in PROMPTS else "gemma2"
    own = PROMPTS[family]
    if data.audio_token not in vocab:
        yield _error("audio_token", f"data.audio_token={data.audio_token!r} is not one token of data.tokenizer="
                                    f"{data.tokenizer}; choose a token the tokenizer already has (for {family} "
                                    f"{own['audio_token']!r}): a new token would need an embedding row the "
                                    f"checkpoint lacks")
    for key, setting in (("bos_token", "add_bos"), ("eos_token", "add_eos")):
        if getattr(data, setting) and key in specials and specials[key] is None:
            yield _error("tokenizer_specials", f"data.{setting}=true but data.tokenizer={data.tokenizer} has no "
                                               f"{key[:3]} token ({key} is null in its tokenizer_config.json, as "
                                               f"in Qwen's): set data.{setting}=false")
    # A turn marker of another family's chat format is no token of this tokenizer: it would
    # be trained as the text pieces it splits into, a prompt the model never saw.
    templates = [("data.prompt_template", data.prompt_template), ("data.response_suffix", data.response_suffix)]
    templates += [(f"data.{split}[{entry.name}].prompt_template", entry.prompt_template)
                  for split in ("train", "validation") for entry in getattr(data, split) if entry.prompt_template]
    strangers = [f"{where} holds {', '.join(found)}" for where, text in templates
                 if (found := sorted({m for m in _TURN_MARKER.findall(text) if m != "<SpeechHere>" and m not in vocab}))]
    if strangers:
        yield _error("prompt_tokens", f"{'; '.join(strangers)}: markers data.tokenizer={data.tokenizer} does not "
                                      f"have as one token, so the prompt is another chat format's. The {family} "
                                      f"decoder's: {prompt_settings(family)}")
    size = max(vocab.values()) + 1
    if size > model.decoder.vocab_size:
        yield _error("tokenizer_vocab", f"data.tokenizer={data.tokenizer} has {size} token ids but "
                                        f"model.decoder.vocab_size={model.decoder.vocab_size}: ids past the "
                                        f"embedding would fail; use the model's tokenizer or a larger vocab_size")


def _prompt_of_another_family(data: DataConfig, model: ModelConfig) -> Iterator[Finding]:
    """Where the tokenizer cannot be read here (a path only the cluster sees; a tokenizer the
    demo corpus writes later is the job's to check): a chat format and audio placeholder
    that are another family's and not this decoder's are refused all the same, since the
    job would refuse them at start (a recipe composed with another family's model)."""
    own = model.decoder.family
    if own not in PROMPTS or inside(data.tokenizer, data.demo_corpus):
        return
    settings = {"prompt_template": data.prompt_template, "audio_token": data.audio_token}

    def belongs(family: str) -> bool:
        return any(settings[key] == PROMPTS[family][key] for key in settings)

    others = [f for f in PROMPTS if f != own and PROMPTS[f] != PROMPTS[own] and belongs(f)]
    if others and not belongs(own):
        yield _error("prompt_family", f"data.prompt_template={data.prompt_template!r} and data.audio_token="
                                      f"{data.audio_token!r} are the {others[0]} family's chat format, but "
                                      f"model.decoder.family={own}: its tokenizer (data.tokenizer={data.tokenizer}, "
                                      f"not on this machine: checked no further here) has another, and the job would "
                                      f"refuse them at start. The {own} decoder's: {prompt_settings(own)}")
    if data.add_bos and not PROMPTS[own]["add_bos"]:
        yield _error("prompt_family", f"data.add_bos=true but the {own} family's tokenizers have no BOS token (the "
                                      f"job would refuse it at start; data.tokenizer={data.tokenizer} is not on this "
                                      f"machine): set data.add_bos=false")


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
        yield _warning("experiment", f"recipe {recipe} ({file.path}) has run.experiment={run.experiment}, the "
                                     f"experiment of the shipped recipe(s) {', '.join(shipped)}: its runs go under "
                                     f"{run.output_root}/{run.experiment}/ and its W&B runs into that group, among "
                                     f"theirs; set run.experiment to its own (e.g. {recipe}) unless that is meant")


def check_local_inputs(data: DataConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    """The tokenizer and the local datasets exist where the job reads them
    (orchestrator/plan/local_paths.py): refused for a job on this machine, said for a SLURM
    job, whose nodes may see what this machine does not."""
    datasets = [(f"data.{split}[{entry.name}].path", str(entry.path))
                for split in ("train", "validation") for entry in (getattr(data, split) or [])]
    for _, problem in missing_inputs(data.tokenizer, datasets, data.demo_corpus):
        if launcher.kind == "local":
            yield _error("local_paths", f"{problem}; launcher=local runs the job on this machine, where it would "
                                        f"stop at start: point it at what exists here (or write it first)")
        else:
            yield _warning("cluster_paths", f"{problem} (seen from this machine): the job reads it on the compute "
                                            f"nodes at start, which must see it (launcher={launcher.kind})")


def check_dataset_columns(data: DataConfig) -> Iterator[Finding]:
    """Each local dataset this machine can read has the columns its entry reads (the
    job's loader refuses it at start otherwise), from its index.json."""
    for split in ("train", "validation"):
        for entry in getattr(data, split) or []:
            if tasks.entry_problems(entry, data, split):
                continue  # said by check_data
            needed = tasks.dataset_format(entry, data).required_columns()
            for path in local_dataset_dirs(str(entry.path), data.demo_corpus):
                have = index_columns(path)
                missing = [f"{column!r} ({key})" for column, key in needed if have is not None and column not in have]
                if missing:
                    yield _error("dataset_columns", f"data.{split}[{entry.name}] ({path}) has no column "
                                                    f"{', '.join(missing)}; its columns: {have}. Name its columns in "
                                                    f"the entry (audio_field, text_field, instruction_field, "
                                                    f"turns_field), or data.audio_field / data.text_field for all")


def check_packing(data: DataConfig, optim: OptimConfig) -> Iterator[Finding]:
    if data.packing and data.packing_buffer < optim.micro_batch_size:
        yield _error(
            "packing_buffer",
            f"data.packing_buffer ({data.packing_buffer}) is smaller than optim.micro_batch_size "
            f"({optim.micro_batch_size}): the packer needs at least one sample per row to fill a micro-batch",
        )


def check_optim(optim: OptimConfig, train: TrainConfig) -> Iterator[Finding]:
    yield from _one_of("optim", "optim.optimizer", optim.optimizer, ("adam", "sgd"))
    yield from _one_of("optim", "optim.lr_decay_style", optim.lr_decay_style, ("cosine", "linear", "constant"))
    if optim.lr <= 0:
        yield _error("lr", f"optim.lr={optim.lr} must be positive (freeze modules with lora.lr_groups lr_scale 0)")
    if optim.min_lr < 0 or optim.min_lr > optim.lr:
        yield _error("min_lr", f"optim.min_lr ({optim.min_lr}) must be in [0, optim.lr ({optim.lr})]")
    if optim.lr_warmup_iters < 0 or optim.lr_warmup_iters >= max(train.iters, 1):
        yield _error(
            "warmup",
            f"optim.lr_warmup_iters ({optim.lr_warmup_iters}) must be in [0, train.iters ({train.iters}))",
        )
    if optim.clip_grad < 0:
        yield _error("optim", f"optim.clip_grad={optim.clip_grad} must be >= 0 (0 disables clipping)")


def check_train(train: TrainConfig, run: RunConfig) -> Iterator[Finding]:
    yield from _positive(
        "train", **{"train.iters": train.iters, "train.log_interval": train.log_interval, "train.keep_last": train.keep_last}
    )
    for key in ("eval_interval", "save_interval", "save_interval_minutes", "hang_timeout", "straggler_threshold",
                "eval_iters", "eval_generation_batches", "keep_every"):
        if getattr(train, key) < 0:
            yield _error("train", f"train.{key}={getattr(train, key)} must be >= 0")
    if train.eval_generation and train.eval_generation_max_new_tokens < 1:
        yield _error("train", f"train.eval_generation_max_new_tokens={train.eval_generation_max_new_tokens} must be >= 1")
    yield from _one_of("run", "run.resume", run.resume, ("auto", "never"))


def check_profile(train: TrainConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    """train.profile_steps: off, or [first, last] steps of the run; train.profile_ranks:
    ranks the job has (orchestrator/train/profiling.py)."""
    steps, ranks, world = list(train.profile_steps), list(train.profile_ranks), world_size(launcher)
    if steps and not (len(steps) == 2 and 1 <= steps[0] <= steps[1] <= train.iters):
        yield _error("profile", f"train.profile_steps={steps} must be [first, last] with 1 <= first <= last <= "
                                f"train.iters ({train.iters}), e.g. [10, 10] for one step; [] turns profiling off")
    outside = [r for r in ranks if not 0 <= r < world]
    if steps and (outside or not ranks):
        yield _error("profile", f"train.profile_ranks={ranks} must name ranks of the job, 0 to {world - 1} "
                                f"(launcher.nodes {launcher.nodes} x launcher.gpus_per_node "
                                f"{launcher.gpus_per_node}), e.g. [0]")


def check_ctc(model: ModelConfig, parallel: ParallelConfig, train: TrainConfig) -> Iterator[Finding]:
    if model.adapter.ctc_weight > 0 and parallel.pp > 1:
        yield _error("ctc", f"model.adapter.ctc_weight={model.adapter.ctc_weight}: the auxiliary CTC loss is computed "
                            f"on the first pipeline stage and added to the loss on the last, so it needs "
                            f"parallel.pp=1 (got {parallel.pp}); set model.adapter.ctc_weight=0 or parallel.pp=1")
    weight = train.eval_generation_ctc_weight
    if not 0 <= weight <= 1:
        yield _error("ctc", f"train.eval_generation_ctc_weight={weight} must be within [0, 1] (0: the decoder alone)")
    elif weight > 0 and model.adapter.ctc_weight <= 0:
        # A warning: a recipe's decoding setting should not stop a run that turns the CTC
        # loss off (pipeline parallel needs that); generation_eval decodes with the decoder alone.
        yield _warning("ctc", f"train.eval_generation_ctc_weight={weight} has no effect: joint CTC/attention decoding "
                              f"scores with the adapter's CTC head, which the model has only when trained with the "
                              f"CTC loss (model.adapter.ctc_weight={model.adapter.ctc_weight}); transcripts are decoded "
                              f"by the decoder alone")


def check_eval_generation(train: TrainConfig, data: DataConfig, parallel: ParallelConfig) -> Iterator[Finding]:
    if not train.eval_generation:
        return
    if not data.validation:
        yield _error("eval_generation", "train.eval_generation=true needs validation datasets to decode, but "
                                        "data.validation is empty; add datasets to data.validation or set "
                                        "train.eval_generation=false")
    if (parallel.vpp or 1) > 1:
        yield _warning("eval_generation", f"train.eval_generation=true: greedy decoding inside training does not run "
                                          f"with virtual pipeline chunks (parallel.vpp={parallel.vpp}), so training "
                                          f"reports no generation metrics; score checkpoints with `audiollm eval "
                                          f"RUN_DIR` (any layout: --tp, --pp)")


def check_launcher(launcher: LauncherConfig) -> Iterator[Finding]:
    yield from _one_of("launcher", "launcher.kind", launcher.kind, ("local", "slurm"))
    yield from _one_of("launcher", "launcher.accelerator", launcher.accelerator, ("gpu", "cpu"))
    if launcher.kind == "local" and launcher.nodes != 1:
        yield _error(
            "launcher",
            f"launcher.kind=local runs on this machine only, but launcher.nodes={launcher.nodes}; "
            f"use launcher=slurm for several nodes",
        )
    if launcher.max_requeues < 0:
        yield _error("launcher", f"launcher.max_requeues={launcher.max_requeues} must be >= 0")
    if "." not in launcher.entry.replace(":", "."):
        yield _error("launcher", f"launcher.entry={launcher.entry!r} must be a dotted path 'package.module.function'")
    for key in ("cpus_per_task", "timeout_min", "signal_delay_s", "array_parallelism"):
        if getattr(launcher, key) < 1:
            yield _error("launcher", f"launcher.{key}={getattr(launcher, key)} must be at least 1")


def check_logger(logger: LoggerConfig) -> Iterator[Finding]:
    yield from _one_of("logger", "logger.backend", logger.backend, ("wandb", "none"))
    if logger.mode is not None:  # null: $WANDB_MODE, read by the job
        yield from _one_of("logger", "logger.mode", logger.mode, WANDB_MODES)


# --------------------------------------------------------------------------- LoRA and lr groups
def check_lora(lora: LoraConfig, model: ModelConfig) -> Iterator[Finding]:
    if lora.rank < 0:
        yield _error("lora", f"lora.rank={lora.rank} must be >= 0 (0 disables LoRA)")
    if lora.rank == 0:
        return
    unknown = [t for t in lora.targets if t not in LORA_TARGETS]
    if unknown:
        yield _error(
            "lora_targets",
            f"lora.targets {unknown} do not exist in model {model.name}; decoder linears are {list(LORA_TARGETS)}",
        )
    if not lora.targets:
        yield _error("lora_targets", f"lora.rank={lora.rank} but lora.targets is empty")
    smallest = min(model.decoder.hidden_size, model.decoder.kv_channels * model.decoder.num_query_groups)
    if lora.rank > smallest:
        yield _error(
            "lora_rank",
            f"lora.rank ({lora.rank}) exceeds the smallest adapted dimension ({smallest}) of model {model.name}",
        )
    if lora.alpha <= 0:
        yield _error("lora", f"lora.alpha={lora.alpha} must be positive")
    if not 0.0 <= lora.dropout < 1.0:
        yield _error("lora", f"lora.dropout={lora.dropout} must be in [0, 1)")


def check_lr_group_fields(lora: LoraConfig) -> Iterator[Finding]:
    if not lora.lr_groups:
        yield _error("lr_groups", "lora.lr_groups is empty; add at least {name: all, patterns: ['*'], lr_scale: 1.0}")
    names = [g.name for g in lora.lr_groups]
    for name in sorted({n for n in names if names.count(n) > 1}):
        yield _error("lr_groups", f"lora.lr_groups has two groups named {name!r}")
    for group in lora.lr_groups:
        if group.lr_scale < 0:
            yield _error("lr_groups", f"lora.lr_groups[{group.name}].lr_scale={group.lr_scale} must be >= 0")
        if not group.patterns:
            yield _error("lr_groups", f"lora.lr_groups[{group.name}] has no patterns")


@dataclass(frozen=True)
class NamedParam:
    """What lr-group rules need to know of a parameter (from model_params)."""

    name: str
    frozen: bool  # frozen by the model config (encoder.freeze, adapter.freeze, LoRA base weights)


def check_lr_groups_against_params(lora: LoraConfig, params: list[NamedParam], model_name: str) -> Iterator[Finding]:
    """Every pattern matches something; every trainable parameter falls in a group;
    no group with a non-zero rate holds only frozen parameters."""
    for group in lora.lr_groups:
        for pattern in group.patterns:
            if not any(fnmatch.fnmatchcase(p.name, pattern) for p in params):
                yield _error(
                    "lr_group_pattern",
                    f"lora.lr_groups[{group.name}] pattern {pattern!r} matches no parameter of model {model_name} "
                    f"(names look like {params[0].name if params else '?'}); see `audiollm plan --params`",
                )
    members: dict[str, list[NamedParam]] = {g.name: [] for g in lora.lr_groups}
    unmatched = []
    for param in params:
        group = next((g for g in lora.lr_groups if any(fnmatch.fnmatchcase(param.name, p) for p in g.patterns)), None)
        if group is None:
            if not param.frozen:
                unmatched.append(param.name)
        else:
            members[group.name].append(param)
    if unmatched:
        shown = ", ".join(unmatched[:5]) + (f" and {len(unmatched) - 5} more" if len(unmatched) > 5 else "")
        yield _error(
            "lr_group_unmatched",
            f"{len(unmatched)} trainable parameter(s) match no lora.lr_groups entry: {shown}; "
            f"add a group (for example {{name: rest, patterns: ['*'], lr_scale: 1.0}}) — there is no default rate",
        )
    for group in lora.lr_groups:
        in_group = members[group.name]
        if group.lr_scale > 0 and in_group and all(p.frozen for p in in_group):
            yield _error(
                "lr_frozen",
                f"lora.lr_groups[{group.name}] has lr_scale {group.lr_scale} but all its {len(in_group)} parameters "
                f"are frozen by the model config (e.g. {in_group[0].name}); set its lr_scale to 0 or unfreeze "
                f"the module (model.encoder.freeze / model.adapter.freeze / model.decoder.freeze)",
            )


def _named_params(model: ModelConfig, lora: LoraConfig, tp: int) -> list[NamedParam]:
    from orchestrator.plan.model_params import parameter_inventory

    # At the plan's TP (names do not depend on it): the estimate then reuses this inventory.
    return [NamedParam(p.name, not p.trainable) for p in parameter_inventory(model, lora, max(tp, 1))]


# --------------------------------------------------------------------------- entry points
def validate(cfg: AudioLLMConfig, purpose: str = "plan") -> list[Finding]:
    """All findings for `cfg` (errors and warnings). purpose: plan | train."""
    p, m, l = cfg.parallel, cfg.model, cfg.launcher
    rules: list[Callable[[], Iterable[Finding]]] = [
        lambda: check_sizes(p, l),
        lambda: check_world_size(p, l),
        lambda: check_rank_order(p),
        lambda: check_heads(p, m),
        lambda: check_layers(p, m),
        lambda: check_sequence(p, cfg.data, m),
        lambda: check_sequence_parallel(p),
        lambda: check_context_parallel(p, cfg.data),
        lambda: check_batch(p, l, cfg.optim),
        lambda: check_canonical_nodes(p, l, cfg.data, cfg.optim),
        lambda: check_recompute(p, m),
        lambda: check_distributed_optimizer(p, l),
        lambda: check_decoder(m),
        lambda: check_encoder(m),
        lambda: check_backend(m, l),
        lambda: check_compile(m, p),
        lambda: check_trained_encoder_precision(m, cfg.lora, l),
        lambda: check_init_checkpoint(m, cfg.lora),
        lambda: check_data(cfg.data, m, purpose),
        lambda: check_packing(cfg.data, cfg.optim),
        lambda: check_tokenizer(cfg.data, m, purpose),
        lambda: check_local_inputs(cfg.data, l),
        lambda: check_dataset_columns(cfg.data),
        lambda: check_own_experiment(cfg.recipe, cfg.run),
        lambda: check_optim(cfg.optim, cfg.train),
        lambda: check_train(cfg.train, cfg.run),
        lambda: check_profile(cfg.train, l),
        lambda: check_eval_generation(cfg.train, cfg.data, p),
        lambda: check_ctc(m, p, cfg.train),
        lambda: check_launcher(l),
        lambda: check_logger(cfg.logger),
        lambda: check_lora(cfg.lora, m),
        lambda: check_lr_group_fields(cfg.lora),
    ]
    findings = [f for rule in rules for f in rule()]
    # Parameter names are only meaningful once the model's own fields are valid.
    if not any(f.severity == ERROR and f.rule in ("decoder", "encoder", "adapter", "lora", "lora_targets", "lora_rank")
               for f in findings):
        findings += list(check_lr_groups_against_params(cfg.lora, _named_params(m, cfg.lora, p.tp), m.name))
    return findings


def check(cfg: AudioLLMConfig, purpose: str = "plan") -> list[Finding]:
    """Raise ConfigInvalid if any finding is an error; return the warnings otherwise."""
    findings = validate(cfg, purpose)
    if any(f.severity == ERROR for f in findings):
        raise ConfigInvalid(findings)
    return findings
