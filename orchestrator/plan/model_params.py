"""Every parameter of the AudioLLM by name and full (unsharded) shape, without torch.

The submit side needs the real parameter names (lr-group patterns and LoRA targets
are validated against them) and sizes (memory and FLOP estimates) without building
the model. Names follow the modules the job builds: `encoder.*` is HF's
WhisperEncoder, `adapter.*` ours, `language_model.*` megatron-core's GPTModel with
the Gemma2 layer (tests compare this list with the real model's named_parameters).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, is_dataclass
from typing import Optional

from orchestrator.plan.adapter_kinds import adapter_kind, frames_per_token, linear_shapes
from orchestrator.plan.decoder_families import family_of
from orchestrator.plan.megatron_args import padded_vocab_size
from orchestrator.plan.schema import LoraConfig, ModelConfig

ENCODER_LORA_TARGETS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc1", "fc2")


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]  # full shape, before tensor-parallel sharding
    component: str  # encoder | adapter | decoder | embedding
    tp_split_dim: Optional[int]  # dimension split over TP ranks; None = replicated
    trainable: bool  # under the model and LoRA config (lr_scale 0 may freeze more: estimate.inventory_for)
    layer: Optional[int] = None  # decoder layer index (global), for pipeline placement

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _linear(prefix, out_dim, in_dim, component, trainable, bias=True, split=None, layer=None):
    specs = [ParamSpec(f"{prefix}.weight", (out_dim, in_dim), component, split, trainable, layer)]
    if bias:
        bias_split = 0 if split == 0 else None
        specs.append(ParamSpec(f"{prefix}.bias", (out_dim,), component, bias_split, trainable, layer))
    return specs


def _norm(prefix, dim, component, trainable, bias=True, layer=None):
    specs = [ParamSpec(f"{prefix}.weight", (dim,), component, None, trainable, layer)]
    if bias:
        specs.append(ParamSpec(f"{prefix}.bias", (dim,), component, None, trainable, layer))
    return specs


def _lora(prefix, out_dim, in_dim, rank, component, split, layer=None):
    """LoRA pair on a linear of shape [out, in]: column-parallel (split 0) shards B's
    output, row-parallel (split 1) shards A's input; the other factor is replicated."""
    a_split = 1 if split == 1 else None
    b_split = 0 if split == 0 else None
    return [
        ParamSpec(f"{prefix}.lora_a.weight", (rank, in_dim), component, a_split, True, layer),
        ParamSpec(f"{prefix}.lora_b.weight", (out_dim, rank), component, b_split, True, layer),
    ]


def encoder_params(model: ModelConfig, lora: LoraConfig) -> list[ParamSpec]:
    enc = model.encoder
    d, f = enc.d_model, enc.ffn_dim
    adapted = lora.rank > 0 and lora.encoder
    # LoRA freezes the weights of the linears it adapts (orchestrator/train/lora.py); the
    # rest trains unless the encoder is frozen.
    base_trainable = not enc.freeze
    linear_trainable = base_trainable and not adapted
    c = "encoder"
    specs = _linear("encoder.conv1", d, enc.num_mel_bins * 3, c, base_trainable)
    specs[0] = ParamSpec("encoder.conv1.weight", (d, enc.num_mel_bins, 3), c, None, base_trainable)
    conv2 = _linear("encoder.conv2", d, d * 3, c, base_trainable)
    conv2[0] = ParamSpec("encoder.conv2.weight", (d, d, 3), c, None, base_trainable)
    specs += conv2
    # Sinusoidal positions: HF keeps them as a frozen parameter.
    specs.append(ParamSpec("encoder.embed_positions.weight", (enc.max_source_positions, d), c, None, False))
    shapes = {
        "self_attn.q_proj": (d, d, True),
        "self_attn.k_proj": (d, d, False),  # Whisper's key projection has no bias
        "self_attn.v_proj": (d, d, True),
        "self_attn.out_proj": (d, d, True),
        "fc1": (f, d, True),
        "fc2": (d, f, True),
    }
    for i in range(enc.num_layers):
        p = f"encoder.layers.{i}"
        for name in ("self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj", "self_attn.out_proj"):
            out_dim, in_dim, bias = shapes[name]
            specs += _linear(f"{p}.{name}", out_dim, in_dim, c, linear_trainable, bias=bias)
        specs += _norm(f"{p}.self_attn_layer_norm", d, c, base_trainable)
        for name in ("fc1", "fc2"):
            out_dim, in_dim, bias = shapes[name]
            specs += _linear(f"{p}.{name}", out_dim, in_dim, c, linear_trainable, bias=bias)
        specs += _norm(f"{p}.final_layer_norm", d, c, base_trainable)
        if adapted:
            for name in ENCODER_LORA_TARGETS:
                out_dim, in_dim, _ = shapes[name]
                specs += _lora(f"{p}.{name}", out_dim, in_dim, lora.rank, c, None)
    specs += _norm("encoder.layer_norm", d, c, base_trainable)
    return specs


def adapter_params(model: ModelConfig, lora: LoraConfig) -> list[ParamSpec]:
    """The adapter of `model.adapter.kind` (orchestrator/plan/adapter_kinds.py)."""
    d, hidden = model.encoder.d_model, model.decoder.hidden_size
    adapted = lora.rank > 0 and lora.adapter
    trainable = not model.adapter.freeze
    c = "adapter"
    specs = []
    if adapter_kind(model.adapter).layer_mix:
        # One mixing weight per encoder layer output: entries 1..N of HF's hidden_states
        # (the embedding entry 0 is left out; see orchestrator/models/speech.py).
        specs += [ParamSpec("adapter.layer_weights", (model.encoder.num_layers,), c, None, trainable)]
        specs += _norm("adapter.norm", d, c, trainable)
    linears = linear_shapes(model.adapter, d, hidden)
    for name, out_dim, in_dim, bias in linears:
        specs += _linear(f"adapter.{name}", out_dim, in_dim, c, trainable and not adapted, bias=bias)
    if model.adapter.ctc_weight > 0:  # the auxiliary CTC head: vocabulary + blank (never LoRA-adapted)
        specs += _linear("adapter.ctc_head", model.decoder.vocab_size + 1, hidden, c, not model.adapter.freeze)
    if adapted:
        for name, out_dim, in_dim, _ in linears:
            specs += _lora(f"adapter.{name}", out_dim, in_dim, lora.rank, c, None)
    return specs


def decoder_params(model: ModelConfig, lora: LoraConfig, tp: int = 1) -> list[ParamSpec]:
    dec = model.decoder
    h, kv = dec.hidden_size, dec.kv_channels
    qkv_out = (dec.num_attention_heads + 2 * dec.num_query_groups) * kv
    base_trainable = not dec.freeze  # LoRA freezes only the linears it adapts
    vocab = padded_vocab_size(dec.vocab_size, tp)
    specs = [ParamSpec("language_model.embedding.word_embeddings.weight", (vocab, h), "embedding", 0, base_trainable)]
    linears = {
        "self_attention.linear_qkv": (qkv_out, h, 0),
        "self_attention.linear_proj": (h, dec.num_attention_heads * kv, 1),
        "mlp.linear_fc1": (2 * dec.ffn_hidden_size, h, 0),  # [gate; up] of the gated MLP
        "mlp.linear_fc2": (h, dec.ffn_hidden_size, 1),
    }
    order = [
        ("input_layernorm", None),
        ("self_attention.linear_qkv", "linear_qkv"),
        ("self_attention.linear_proj", "linear_proj"),
        ("post_attention_layernorm", None),
        ("pre_mlp_layernorm", None),
        ("mlp.linear_fc1", "linear_fc1"),
        ("mlp.linear_fc2", "linear_fc2"),
        ("post_mlp_layernorm", None),
    ]
    family = family_of(dec)
    if not family.sandwich_norms:
        order = [(name, target) for name, target in order if not name.startswith("post_")]
    if family.qk_norm:  # over head_dim, replicated over TP (megatron sums their gradients there)
        at = order.index(("self_attention.linear_proj", "linear_proj"))
        order[at:at] = [("self_attention.q_layernorm", None), ("self_attention.k_layernorm", None)]
    for i in range(dec.num_layers):
        p = f"language_model.decoder.layers.{i}"
        for name, target in order:
            if target is None:
                width = kv if name.endswith(("q_layernorm", "k_layernorm")) else h
                specs += _norm(f"{p}.{name}", width, "decoder", base_trainable, bias=False, layer=i)
                continue
            out_dim, in_dim, split = linears[name]
            adapted = lora.rank > 0 and target in lora.targets
            bias = family.qkv_bias and target == "linear_qkv"
            specs += _linear(f"{p}.{name}", out_dim, in_dim, "decoder", base_trainable and not adapted, bias=bias,
                             split=split, layer=i)
            if adapted:
                specs += _lora(f"{p}.{name}", out_dim, in_dim, lora.rank, "decoder", split, layer=i)
    specs += _norm("language_model.decoder.final_layernorm", h, "decoder", base_trainable, bias=False)
    if not dec.tie_embeddings:
        specs.append(ParamSpec("language_model.output_layer.weight", (vocab, h), "embedding", 0, base_trainable))
    return specs


def model_name(name: str) -> str:
    """A parameter name of the job's wrapped model (DDP's and Float16Module's `module.`
    prefixes) as this inventory and the model's sharded_state_dict name it."""
    while name.startswith("module."):
        name = name[len("module."):]
    return name


# Whisper's features: 16-kHz audio, a mel frame every 160 samples (100 per second).
SAMPLE_RATE = 16000


def encoder_frame_count(mel_frames: int) -> int:
    """Encoder output frames of `mel_frames` input frames (Whisper conv2: stride 2, pad 1)."""
    return (mel_frames - 1) // 2 + 1 if mel_frames > 0 else 0


def audio_token_count(mel_frames: int, frames_per_token: int) -> int:
    """Audio tokens (placeholders in input_ids) of a clip of `mel_frames` mel frames:
    whole groups of `frames_per_token` encoder frames (adapter_kinds.frames_per_token); a
    trailing partial group is dropped. 30 s (3000 frames) -> 1500 encoder frames -> 300
    tokens with layer_mix's frame_stack 5, 375 with voxtral's 4, 750 with qwen2_audio's
    pool of 2."""
    return encoder_frame_count(mel_frames) // frames_per_token


# data.audio_tokens: how a clip's audio tokens are counted (read_frames).
AUDIO_TOKEN_MODES = ("clip", "window")


def read_frames(valid_mel_frames: int, window_frames: int, mode: str = "clip") -> int:
    """The mel frames of a clip that the model reads and counts its tokens from (its "audio
    lengths"): mode "clip", the clip's own `valid_mel_frames` (capped at the window); mode
    "window", the whole window, as Whisper always encodes 30 s (and Voxtral's processor
    pads every clip to whole windows). `mode`: data.audio_tokens."""
    if mode == "window":
        return window_frames
    if mode == "clip":
        return min(valid_mel_frames, window_frames)
    raise ValueError(f"data.audio_tokens={mode!r}; use one of {', '.join(AUDIO_TOKEN_MODES)}")


def clip_read_frames(seconds: float, model: ModelConfig, mode: str = "clip") -> int:
    """read_frames of a clip of `seconds` (100 mel frames per second)."""
    return read_frames(math.ceil(seconds * 100), 2 * model.encoder.max_source_positions, mode)


def audio_tokens_per_clip(seconds: float, model: ModelConfig, mode: str = "clip") -> int:
    """Decoder tokens the adapter makes for a clip of `seconds` (data.audio_tokens `mode`)."""
    return audio_token_count(clip_read_frames(seconds, model, mode), frames_per_token(model.adapter))


# Inventories by their inputs: validation and the estimates of one plan ask for the same one.
_INVENTORIES: dict[str, tuple[ParamSpec, ...]] = {}


def parameter_inventory(model: ModelConfig, lora: LoraConfig, tp: int = 1) -> list[ParamSpec]:
    """All parameters of the AudioLLM (pipeline-parallel size 1 naming); built once per
    (model, lora, tp) in a process."""
    if not (is_dataclass(model) and is_dataclass(lora)):  # duck-typed configs (scripts): not memoized
        return encoder_params(model, lora) + adapter_params(model, lora) + decoder_params(model, lora, tp)
    key = json.dumps([asdict(model), asdict(lora), tp], sort_keys=True, default=str)
    if key not in _INVENTORIES:
        if len(_INVENTORIES) >= 64:  # a sweep of many models: keep memory bounded
            _INVENTORIES.clear()
        _INVENTORIES[key] = tuple(encoder_params(model, lora) + adapter_params(model, lora)
                                  + decoder_params(model, lora, tp))
    return list(_INVENTORIES[key])
