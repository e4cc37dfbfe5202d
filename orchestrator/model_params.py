"""Analytic parameter inventory of the AudioLLM (pure Python: no torch import).

`parameter_inventory(model_cfg, lora_cfg)` lists every parameter of the whole model at
PP=1 with the names of the project's parameter-naming contract, its full (unsplit)
shape, its component, the dimension tensor parallelism splits (None: replicated) and
whether the config leaves it trainable. The submit side uses it to check lr-group
patterns and LoRA targets against real names and to estimate memory; a test keeps it
equal to the real model's `named_parameters()`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

DECODER_LINEARS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
# Tensor-parallel style of each decoder linear: column-parallel ones split their output
# rows (dim 0), row-parallel ones their input columns (dim 1).
_COLUMN_PARALLEL = {"linear_qkv", "linear_fc1"}
ENCODER_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc1", "fc2")
ADAPTER_LINEARS = ("linear_1", "linear_2")


@dataclass(frozen=True)
class ParamInfo:
    name: str
    shape: Tuple[int, ...]
    component: str  # encoder | adapter | decoder
    tp_split_dim: Optional[int]
    trainable: bool

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def encoder_frame_count(mel_frames: int) -> int:
    """Encoder output frames of `mel_frames` input frames (Whisper conv2: stride 2, pad 1)."""
    return (mel_frames - 1) // 2 + 1 if mel_frames > 0 else 0


def audio_token_count(mel_frames: int, frame_stack: int) -> int:
    """Audio tokens (placeholders in input_ids) for a clip of `mel_frames` mel frames:
    whole groups of `frame_stack` encoder frames; a trailing partial group is dropped.
    30 s (3000 frames) -> 1500 encoder frames -> 300 tokens with frame_stack 5."""
    return encoder_frame_count(mel_frames) // frame_stack


def padded_vocab(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    multiple = divisible_by * tp
    return int(math.ceil(vocab_size / multiple) * multiple)


def _lora(base: str, out_dim: int, in_dim: int, rank: int, component: str, column: Optional[bool]) -> List[ParamInfo]:
    """LoRA pair of a linear `base` (name without `.weight`): lora_a [rank, in], lora_b [out, rank].
    Column-parallel bases split lora_b rows, row-parallel ones lora_a columns; None: not split."""
    a_split = 1 if column is False else None
    b_split = 0 if column else None
    return [ParamInfo(f"{base}.lora_a.weight", (rank, in_dim), component, a_split, True),
            ParamInfo(f"{base}.lora_b.weight", (out_dim, rank), component, b_split, True)]


def encoder_params(enc, lora_rank: int = 0) -> List[ParamInfo]:
    d, f, train = enc.d_model, enc.ffn_dim, not enc.freeze
    out = [ParamInfo("encoder.conv1.weight", (d, enc.num_mel_bins, 3), "encoder", None, train),
           ParamInfo("encoder.conv1.bias", (d,), "encoder", None, train),
           ParamInfo("encoder.conv2.weight", (d, d, 3), "encoder", None, train),
           ParamInfo("encoder.conv2.bias", (d,), "encoder", None, train),
           # sinusoidal table, never trained (HF sets requires_grad=False)
           ParamInfo("encoder.embed_positions.weight", (enc.max_source_positions, d), "encoder", None, False)]
    for i in range(enc.num_layers):
        p = f"encoder.layers.{i}."
        dims = {"self_attn.q_proj": (d, d, True), "self_attn.k_proj": (d, d, False),
                "self_attn.v_proj": (d, d, True), "self_attn.out_proj": (d, d, True),
                "fc1": (f, d, True), "fc2": (d, f, True)}
        for lin in ("self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj", "self_attn.out_proj"):
            o, n, bias = dims[lin]
            out.append(ParamInfo(p + lin + ".weight", (o, n), "encoder", None, train))
            if bias:
                out.append(ParamInfo(p + lin + ".bias", (o,), "encoder", None, train))
        out += [ParamInfo(p + "self_attn_layer_norm.weight", (d,), "encoder", None, train),
                ParamInfo(p + "self_attn_layer_norm.bias", (d,), "encoder", None, train)]
        for lin in ("fc1", "fc2"):
            o, n, _ = dims[lin]
            out += [ParamInfo(p + lin + ".weight", (o, n), "encoder", None, train),
                    ParamInfo(p + lin + ".bias", (o,), "encoder", None, train)]
        out += [ParamInfo(p + "final_layer_norm.weight", (d,), "encoder", None, train),
                ParamInfo(p + "final_layer_norm.bias", (d,), "encoder", None, train)]
        if lora_rank:
            for lin in ENCODER_LINEARS:
                o, n, _ = dims[lin]
                out += _lora(p + lin, o, n, lora_rank, "encoder", None)
    out += [ParamInfo("encoder.layer_norm.weight", (d,), "encoder", None, train),
            ParamInfo("encoder.layer_norm.bias", (d,), "encoder", None, train)]
    return out


def adapter_params(adapter, enc, hidden: int, lora_rank: int = 0) -> List[ParamInfo]:
    kd, d, train = adapter.frame_stack * enc.d_model, enc.d_model, not adapter.freeze
    out = [ParamInfo("adapter.layer_weights", (enc.num_layers,), "adapter", None, train),
           ParamInfo("adapter.norm.weight", (d,), "adapter", None, train),
           ParamInfo("adapter.norm.bias", (d,), "adapter", None, train),
           ParamInfo("adapter.linear_1.weight", (kd, kd), "adapter", None, train),
           ParamInfo("adapter.linear_1.bias", (kd,), "adapter", None, train),
           ParamInfo("adapter.linear_2.weight", (hidden, kd), "adapter", None, train),
           ParamInfo("adapter.linear_2.bias", (hidden,), "adapter", None, train)]
    if lora_rank:
        out += _lora("adapter.linear_1", kd, kd, lora_rank, "adapter", None)
        out += _lora("adapter.linear_2", hidden, kd, lora_rank, "adapter", None)
    return out


def decoder_params(dec, tp: int = 1, lora_rank: int = 0, lora_targets=()) -> List[ParamInfo]:
    h, train = dec.hidden_size, not dec.freeze
    qkv_out = (dec.num_attention_heads + 2 * dec.num_query_groups) * dec.kv_channels
    shapes = {"linear_qkv": (qkv_out, h), "linear_proj": (h, dec.num_attention_heads * dec.kv_channels),
              "linear_fc1": (2 * dec.ffn_hidden_size, h), "linear_fc2": (h, dec.ffn_hidden_size)}
    owner = {"linear_qkv": "self_attention", "linear_proj": "self_attention", "linear_fc1": "mlp", "linear_fc2": "mlp"}
    lm = "language_model."
    out = [ParamInfo(lm + "embedding.word_embeddings.weight", (padded_vocab(dec.vocab_size, tp), h), "decoder", 0, train)]
    for i in range(dec.num_layers):
        p = f"{lm}decoder.layers.{i}."

        def norm(name):
            return ParamInfo(p + name + ".weight", (h,), "decoder", None, train)

        def linear(name):
            base = f"{p}{owner[name]}.{name}"
            column = name in _COLUMN_PARALLEL
            items = [ParamInfo(base + ".weight", shapes[name], "decoder", 0 if column else 1, train)]
            if lora_rank and name in lora_targets:
                items += _lora(base, shapes[name][0], shapes[name][1], lora_rank, "decoder", column)
            return items

        out += [norm("input_layernorm"), *linear("linear_qkv"), *linear("linear_proj"),
                norm("post_attention_layernorm"), norm("pre_mlp_layernorm"), *linear("linear_fc1"),
                *linear("linear_fc2"), norm("post_mlp_layernorm")]
    out.append(ParamInfo(lm + "decoder.final_layernorm.weight", (h,), "decoder", None, train))
    return out


def parameter_inventory(model_cfg, lora_cfg=None, tp: int = 1) -> List[ParamInfo]:
    """Every parameter of the AudioLLM at PP=1 (vocab padded for `tp`). `lora_cfg`
    (the `lora` section; None or rank 0: no LoRA) adds the LoRA pairs of its targets."""
    rank = int(getattr(lora_cfg, "rank", 0) or 0) if lora_cfg is not None else 0
    targets = tuple(getattr(lora_cfg, "targets", ()) or ()) if rank else ()
    unknown = sorted(set(targets) - set(DECODER_LINEARS))
    if unknown:
        raise ValueError(f"lora.targets {unknown} are not decoder linears; choose from {list(DECODER_LINEARS)}")
    enc_rank = rank if rank and getattr(lora_cfg, "encoder", False) else 0
    ad_rank = rank if rank and getattr(lora_cfg, "adapter", False) else 0
    return (encoder_params(model_cfg.encoder, enc_rank)
            + adapter_params(model_cfg.adapter, model_cfg.encoder, model_cfg.decoder.hidden_size, ad_rank)
            + decoder_params(model_cfg.decoder, tp, rank, targets))
