"""Rules of the model section: the decoder (its family's keys, windows, global layers), the
encoder and adapter, pretrained weights (model.init_checkpoint: there, readable, of this
model), precision, backend and compilation."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from orchestrator.plan.adapter_kinds import ADAPTER_KINDS, KIND_KEYS, dropout, frame_stack, frames_per_token
from orchestrator.plan.decoder_families import FAMILIES
from orchestrator.plan.released_models import released_class, released_of_kind
from orchestrator.plan.checkpoint_dirs import frozen_source_problem, resolve_model_checkpoint
from orchestrator.plan.kernels import ATTENTION_CHOICES, COMPILE_CHOICES, ENCODER_PRECISIONS, compile_blockers
from orchestrator.plan.schema import (
    LauncherConfig,
    LoraConfig,
    ModelConfig,
    ParallelConfig,
)
from orchestrator.plan import checkpoint_model
from orchestrator.plan.rules.findings import Finding, error, one_of, positive, warning


def _ordinal(n: int) -> str:
    """2 -> "2nd", 6 -> "6th"."""
    suffix = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th") if n % 100 not in (11, 12, 13) else "th"
    return f"{n}{suffix}"


def check_decoder(model: ModelConfig) -> Iterator[Finding]:
    dec = model.decoder
    yield from positive(
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
    for key in ("rope_theta", "norm_eps", "init_method_std"):
        if getattr(dec, key) <= 0:
            yield error("decoder", f"model.decoder.{key}={getattr(dec, key)} must be positive")
    if dec.family not in FAMILIES:
        yield error("decoder", f"model.decoder.family={dec.family!r} is not one of {sorted(FAMILIES)}")
        return
    family = FAMILIES[dec.family]
    # What another family's layer has and this one's has not: refused, not ignored.
    applies = {"sliding_window": family.sliding_window, "query_pre_attn_scalar": family.query_pre_attn_scalar,
              "attn_logit_softcap": family.softcaps, "final_logit_softcap": family.softcaps,
              "rope_scaling_factor": family.rope_scaling is not None, "rope_local_theta": family.local_rope}
    for key, used in applies.items():
        if not used and getattr(dec, key) is not None:
            yield error("decoder", f"model.decoder.{key}={getattr(dec, key)} does not apply to the "
                                   f"{dec.family} decoder family: set it to null (model.decoder.{key}=null)")
    for key, used in applies.items():
        value = getattr(dec, key)
        if used and value is not None and value <= 0:
            yield error("decoder", f"model.decoder.{key}={value} must be positive or null (none)")
    if family.local_rope and dec.rope_local_theta is None:
        yield error("decoder", f"model.decoder.rope_local_theta is null: the {dec.family} family's sliding-window "
                               f"layers rotate with their own RoPE base (Gemma 3: 10000, HF rope_local_base_freq)")
    if family.sliding_window and dec.sliding_window is None:
        yield error("decoder", f"model.decoder.sliding_window is null: the {dec.family} family's layers attend within "
                               f"a window on all but every {_ordinal(family.window_pattern)} layer (HF sliding_window: 4096 "
                               f"for Gemma 2, 1024 for Gemma 3 from 4b up); without it every layer attends "
                               f"globally, which is another model: set model.decoder.sliding_window")
    elif family.sliding_window and dec.num_layers < family.window_pattern:
        yield error("decoder", f"model.decoder.num_layers={dec.num_layers} but the {dec.family} family's global "
                               f"layer is every {_ordinal(family.window_pattern)} (HF layer_types): with fewer layers every "
                               f"layer is windowed and none attends globally; use at least {family.window_pattern} "
                               f"layers")
    if family.query_pre_attn_scalar and dec.query_pre_attn_scalar is None:
        yield error("decoder", f"model.decoder.query_pre_attn_scalar is null: the {dec.family} family scales "
                               f"queries by it (Gemma2: 256 at 2b and 9b, HF query_pre_attn_scalar)")


def check_encoder(model: ModelConfig) -> Iterator[Finding]:
    enc = model.encoder
    yield from positive(
        "encoder",
        **{
            "model.encoder.d_model": enc.d_model,
            "model.encoder.num_layers": enc.num_layers,
            "model.encoder.num_heads": enc.num_heads,
            "model.encoder.ffn_dim": enc.ffn_dim,
            "model.encoder.max_source_positions": enc.max_source_positions,
        },
    )
    if enc.num_heads >= 1 and enc.d_model % enc.num_heads:
        yield error(
            "encoder",
            f"model.encoder.d_model ({enc.d_model}) is not divisible by model.encoder.num_heads ({enc.num_heads})",
        )
    yield from one_of("encoder", "model.encoder.num_mel_bins", enc.num_mel_bins, (80, 128))
    if enc.init_std <= 0:
        yield error("encoder", f"model.encoder.init_std={enc.init_std} must be positive")


def check_spec_augment(model: ModelConfig) -> Iterator[Finding]:
    """Masks of a non-negative count, each at least one bin or frame wide, a time share in (0, 1]."""
    aug = model.spec_augment
    for count, width in (("freq_masks", "freq_width"), ("time_masks", "time_width")):
        if getattr(aug, count) < 0:
            yield error("spec_augment", f"model.spec_augment.{count}={getattr(aug, count)} must be >= 0 (0: none)")
        if getattr(aug, width) < 1:
            yield error("spec_augment", f"model.spec_augment.{width}={getattr(aug, width)} must be at least 1 (the "
                                        f"widest mask; no masks of this kind: model.spec_augment.{count}=0)")
    if not 0.0 < aug.time_ratio <= 1.0:
        yield error("spec_augment", f"model.spec_augment.time_ratio={aug.time_ratio} must be in (0, 1] (the largest "
                                    f"share of a clip's frames one time mask covers)")


def check_adapter(model: ModelConfig) -> Iterator[Finding]:
    """The adapter's kind, the keys it reads (and none of another kind's), and what its
    released class can hold (orchestrator/plan/adapter_kinds.py)."""
    adapter, enc = model.adapter, model.encoder
    yield from one_of("adapter", "model.adapter.kind", adapter.kind, tuple(ADAPTER_KINDS))
    if adapter.kind not in ADAPTER_KINDS:
        return
    kind = ADAPTER_KINDS[adapter.kind]
    for key in KIND_KEYS:
        value = getattr(adapter, key)
        if key not in kind.reads and value is not None:
            readers = ", ".join(name for name, other in ADAPTER_KINDS.items() if key in other.reads)
            yield error("adapter", f"model.adapter.{key}={value} is not read by model.adapter.kind={adapter.kind} "
                                   f"(only by {readers}): remove it (model.adapter.{key}=null)")
    if "frame_stack" in kind.reads:
        stack = frame_stack(adapter)
        yield from positive("adapter", **{"model.adapter.frame_stack": stack})
        if adapter.kind == "voxtral" and stack >= 1 and stack * enc.d_model != enc.ffn_dim:
            yield error("adapter", f"model.adapter.kind=voxtral stacks model.adapter.frame_stack ({stack}) x "
                                   f"model.encoder.d_model ({enc.d_model}) = {stack * enc.d_model} features into "
                                   f"one token, which VoxtralForConditionalGeneration reads as the encoder's "
                                   f"intermediate_size (model.encoder.ffn_dim={enc.ffn_dim}): they must be equal")
    per_token = frames_per_token(adapter)
    if per_token >= 1 and enc.max_source_positions >= 1 and enc.max_source_positions % per_token:
        grouped = (f"model.adapter.frame_stack ({frame_stack(adapter)})" if "frame_stack" in kind.reads else
                   f"the {per_token} frames model.adapter.kind={adapter.kind} pools into one token")
        yield error(
            "adapter",
            f"model.encoder.max_source_positions ({enc.max_source_positions}) is not divisible by {grouped}: "
            f"the adapter would drop the last frames of a full window",
        )
    if kind.mask_padding is not None and enc.mask_padding != kind.mask_padding:
        yield error("adapter", f"model.adapter.kind={adapter.kind} computes as {released_class(adapter.kind)} does, whose "
                               f"encoder {'masks' if kind.mask_padding else 'does not mask'} a clip's padded frames, but "
                               f"model.encoder.mask_padding={str(enc.mask_padding).lower()}: set "
                               f"model.encoder.mask_padding={str(kind.mask_padding).lower()}")
    if "dropout" in kind.reads and not 0.0 <= dropout(adapter) < 1.0:
        yield error("adapter", f"model.adapter.dropout={adapter.dropout} must be in [0, 1)")
    if adapter.ctc_weight < 0:
        yield error("adapter", f"model.adapter.ctc_weight={adapter.ctc_weight} must be >= 0 (0: no CTC head)")


def check_init_checkpoint(model: ModelConfig, lora: LoraConfig) -> Iterator[Finding]:
    """The pretrained weights exist and are a checkpoint; nothing is frozen at its
    random initial value (a frozen random encoder is never what anyone means)."""
    if model.init_checkpoint:
        path, problem = resolve_model_checkpoint(model.init_checkpoint)
        problem = problem or frozen_source_problem(Path(path))
        if problem:
            released = released_of_kind(model.adapter.kind)
            if released is not None and path is None:  # the release is converted whole, not from parts
                problem = problem.replace("--hf HF_DECODER_DIR --whisper WHISPER_DIR",
                                          f"--hf {released.name.upper().replace('-', '_')}_DIR (the released "
                                          f"{released.hf_class} directory, whole)")
            yield error("init_checkpoint", f"model.init_checkpoint={model.init_checkpoint}: {problem}")
            return
        other = checkpoint_model.mismatches(model, Path(path))
        if other:  # the job would stop loading it, after the queue
            yield error("init_checkpoint", f"model.init_checkpoint={model.init_checkpoint} holds another model: "
                                           f"{'; '.join(other)}. Point it at weights of this model, or choose the "
                                           f"model config (and its family and shapes) the checkpoint was made for")
        return
    frozen = [f"model.{part}.freeze=true" for part in ("encoder", "adapter", "decoder")
              if getattr(model, part).freeze]
    if lora.rank > 0:
        frozen.append(f"lora.rank={lora.rank} (LoRA freezes the adapted decoder weights)")
    if frozen and model.allow_frozen_random:
        yield warning("frozen_random", f"{', '.join(frozen)} with random weights (model.init_checkpoint is null, "
                                       f"model.allow_frozen_random=true): for measuring speed and memory only, the "
                                       f"losses mean nothing")
    elif frozen:
        yield error("frozen_random", f"{', '.join(frozen)} but model.init_checkpoint is null: frozen weights would "
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
        yield error("encoder_precision",
                    f"model.encoder.precision=fp32 with a trained encoder ({how}) on launcher.accelerator=gpu: a GPU "
                    f"run trains in bf16, and megatron's bf16 optimizer keeps fp32 master weights of bf16 "
                    f"parameters only; use model.encoder.precision=auto (bf16 on GPUs), or freeze the encoder "
                    f"to keep it in fp32")


def check_backend(model: ModelConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    yield from one_of("backend", "model.backend", model.backend, ("local", "te"))
    if model.backend == "te" and launcher.accelerator == "cpu":
        yield error(
            "backend",
            "model.backend=te (TransformerEngine) needs GPUs but launcher.accelerator=cpu; use model.backend=local",
        )
    yield from one_of("encoder_precision", "model.encoder.precision", model.encoder.precision, ENCODER_PRECISIONS)
    if model.encoder.precision == "bf16" and launcher.accelerator == "cpu":
        yield error("encoder_precision", "model.encoder.precision=bf16 runs on GPUs but launcher.accelerator=cpu; "
                                         "use model.encoder.precision=auto or fp32")
    yield from one_of("attention", "model.attention", model.attention, ATTENTION_CHOICES)
    if model.attention == "flex" and launcher.accelerator == "cpu":
        yield error(
            "attention",
            "model.attention=flex (torch's flex_attention) has no backward on CPU but launcher.accelerator=cpu; "
            "use model.attention=reference (or auto, which picks reference on CPU and flex on GPUs)",
        )
    if model.fp8 is not None:
        yield from one_of("fp8", "model.fp8", model.fp8, ("hybrid", "e4m3"))
        if model.backend != "te" or launcher.accelerator != "gpu":
            yield error("fp8", f"model.fp8={model.fp8} runs in TransformerEngine's linears on GPUs, but model.backend="
                               f"{model.backend} and launcher.accelerator={launcher.accelerator}; set model.fp8=null, or "
                               "model.backend=te with launcher.accelerator=gpu")


def check_compile(model: ModelConfig, parallel: ParallelConfig) -> Iterator[Finding]:
    """model.compile=layers where the compiled layer cannot go (auto leaves those layouts
    eager by itself)."""
    yield from one_of("compile", "model.compile", model.compile, COMPILE_CHOICES)
    if model.compile != "layers":
        return
    for setting, reason, fix in compile_blockers(model.backend, parallel.recompute.granularity):
        yield error("compile", f"model.compile=layers with {setting}: {reason}; use {fix}, or model.compile=auto "
                               f"(compiles where it can) or none")
