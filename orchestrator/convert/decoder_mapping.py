"""Decoder weights of every family (Gemma2, Llama, Qwen2, Qwen3): HF names <->
megatron-core names, and TP/PP sharding.

Pure tensor code (no model is built). Layouts, per layer i:

  HF model.layers.i.                      megatron decoder.layers.i.
  input_layernorm                         input_layernorm
  self_attn.{q,k,v}_proj                  self_attention.linear_qkv   rows grouped per KV group:
                                                                      [q heads of group g; k_g; v_g] for g = 0..G-1
  self_attn.{q,k,v}_proj.bias (qwen2)     self_attention.linear_qkv.bias, grouped as its weight's rows
  self_attn.{q,k}_norm (qwen3)            self_attention.{q,k}_layernorm
  self_attn.o_proj                        self_attention.linear_proj
  post_attention_layernorm                post_attention_layernorm
  pre_feedforward_layernorm               pre_mlp_layernorm
  mlp.{gate,up}_proj                      mlp.linear_fc1              [gate; up]
  mlp.down_proj                           mlp.linear_fc2
  post_feedforward_layernorm              post_mlp_layernorm
  model.embed_tokens                      embedding.word_embeddings   rows padded to the TP vocab multiple
  model.norm                              decoder.final_layernorm

Both sides store the zero-centred RMSNorm weight w of x*rsqrt(..)*(1+w): norm weights
are copied unchanged (adding or removing 1 here is the classic porting mistake).

These are the TP=1, PP=1 tensors; megatron's dist_checkpointing splits them for any
layout on load (orchestrator/train/dist_format.py): linear_qkv by KV groups (dim 0),
fc1 as [gate_r; up_r], linear_proj and fc2 along dim 1, embedding rows along dim 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Mapping, Optional, Tuple

import torch

from orchestrator.plan.decoder_families import FAMILIES, family_for_hf, family_of


LAYER_NORMS = {
    "input_layernorm": "input_layernorm",
    "post_attention_layernorm": "post_attention_layernorm",
    "pre_feedforward_layernorm": "pre_mlp_layernorm",
    "post_feedforward_layernorm": "post_mlp_layernorm",
}
# Llama's two pre-norms: HF calls the MLP's `post_attention_layernorm` (it comes after the
# attention's residual), megatron `pre_mlp_layernorm` -- the same name as Gemma2's other norm.
LLAMA_LAYER_NORMS = {"input_layernorm": "input_layernorm", "post_attention_layernorm": "pre_mlp_layernorm"}
# QK-norm (qwen3): one norm over head_dim for all query heads, one for all key heads.
QK_NORMS = {"self_attn.q_norm": "self_attention.q_layernorm", "self_attn.k_norm": "self_attention.k_layernorm"}


def layer_norms(shape: "DecoderShape") -> dict:
    """HF norm name -> megatron norm name within a layer of `shape`'s family."""
    family = FAMILIES[shape.family]
    norms = LAYER_NORMS if family.sandwich_norms else LLAMA_LAYER_NORMS
    return {**norms, **QK_NORMS} if family.qk_norm else norms


@dataclass(frozen=True)
class DecoderShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    family: str = "gemma2"  # orchestrator/plan/decoder_families.py
    tied: bool = True  # the output layer is the embedding (no lm_head / output_layer tensor)

    @classmethod
    def from_hf_config(cls, cfg) -> "DecoderShape":
        get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k, None)
        heads = get("num_attention_heads")
        family = family_for_hf(get("model_type") or "gemma2").name
        tied = get("tie_word_embeddings")
        return cls(get("num_hidden_layers"), get("hidden_size"), heads, get("num_key_value_heads") or heads,
                   get("head_dim") or get("hidden_size") // heads, get("intermediate_size"), get("vocab_size"),
                   family, True if tied is None else bool(tied))


def hf_to_megatron_tensors(hf: Mapping[str, torch.Tensor], shape: DecoderShape) -> Iterator[Tuple[str, torch.Tensor]]:
    """(megatron name at TP=1, PP=1, tensor) for each tensor of a HF decoder's state dict, read from `hf` one layer at a time (vocab unpadded). Every HF tensor must be
    used: an unknown one (another architecture, a renamed tensor) is an error."""
    names = set(hf)
    if shape.tied:
        names.discard("lm_head.weight")  # the tied copy of the embedding
    used = set()

    def take(name):
        if name not in names:
            raise KeyError(f"the HF {shape.family} checkpoint has no tensor {name!r} (config: {shape})")
        used.add(name)
        return hf[name]

    yield "embedding.word_embeddings.weight", take("model.embed_tokens.weight")
    yield "decoder.final_layernorm.weight", take("model.norm.weight")
    if not shape.tied:
        yield "output_layer.weight", take("lm_head.weight")
    g, rep, d = shape.num_kv_heads, shape.num_heads // shape.num_kv_heads, shape.head_dim
    for i in range(shape.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for hf_name, mg_name in layer_norms(shape).items():
            yield dst + mg_name + ".weight", take(src + hf_name + ".weight")
        q = take(src + "self_attn.q_proj.weight").reshape(g, rep * d, -1)
        k = take(src + "self_attn.k_proj.weight").reshape(g, d, -1)
        v = take(src + "self_attn.v_proj.weight").reshape(g, d, -1)
        yield dst + "self_attention.linear_qkv.weight", torch.cat([q, k, v], dim=1).reshape(-1, shape.hidden_size)
        if FAMILIES[shape.family].qkv_bias:
            q, k, v = (take(src + f"self_attn.{x}_proj.bias").reshape(g, -1) for x in "qkv")
            yield dst + "self_attention.linear_qkv.bias", torch.cat([q, k, v], dim=1).reshape(-1)
        yield dst + "self_attention.linear_proj.weight", take(src + "self_attn.o_proj.weight")
        yield dst + "mlp.linear_fc1.weight", torch.cat([take(src + "mlp.gate_proj.weight"),
                                                        take(src + "mlp.up_proj.weight")], dim=0)
        yield dst + "mlp.linear_fc2.weight", take(src + "mlp.down_proj.weight")
    unused = sorted(names - used)
    if unused:
        raise ValueError(f"the HF checkpoint holds tensors a {shape.family} of this config does not have: {unused[:10]}"
                         f"{' ...' if len(unused) > 10 else ''}")


_MEGATRON_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def megatron_tensor_to_hf(name: str, tensor: torch.Tensor, shape: DecoderShape) -> List[Tuple[str, torch.Tensor]]:
    """The HF (name, tensor) pairs of one megatron tensor at TP=1 (inverse of
    `hf_to_megatron_tensors`; vocabulary padding rows are dropped), so an export converts
    each tensor as it is read. An unknown name is an error."""
    if name == "embedding.word_embeddings.weight":
        return [("model.embed_tokens.weight", tensor[: shape.vocab_size])]
    if name == "decoder.final_layernorm.weight":
        return [("model.norm.weight", tensor)]
    if name == "output_layer.weight" and not shape.tied:
        return [("lm_head.weight", tensor[: shape.vocab_size])]
    match = _MEGATRON_LAYER.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a tensor of megatron's {shape.family} decoder (config: {shape})")
    dst, part, kind = f"model.layers.{match.group(1)}.", match.group(2), match.group(3)
    norms = {mg: hf for hf, mg in layer_norms(shape).items()}
    if kind == "bias":
        if part != "self_attention.linear_qkv" or not FAMILIES[shape.family].qkv_bias:
            raise ValueError(f"{name!r} is not a tensor of megatron's {shape.family} decoder (config: {shape})")
    elif part in norms:
        return [(dst + norms[part] + ".weight", tensor)]
    if part == "self_attention.linear_qkv":
        g, rep, d = shape.num_kv_heads, shape.num_heads // shape.num_kv_heads, shape.head_dim
        q, k, v = torch.split(tensor.reshape(g, (rep + 2) * d, -1), [rep * d, d, d], dim=1)
        rows = (-1,) if kind == "bias" else (-1, shape.hidden_size)
        return [(dst + f"self_attn.{x}_proj.{kind}", t.reshape(*rows).contiguous()) for x, t in zip("qkv", (q, k, v))]
    if part == "self_attention.linear_proj":
        return [(dst + "self_attn.o_proj.weight", tensor)]
    if part == "mlp.linear_fc1":
        gate, up = torch.chunk(tensor, 2, dim=0)
        return [(dst + "mlp.gate_proj.weight", gate.contiguous()), (dst + "mlp.up_proj.weight", up.contiguous())]
    if part == "mlp.linear_fc2":
        return [(dst + "mlp.down_proj.weight", tensor)]
    raise ValueError(f"{name!r} is not a tensor of megatron's {shape.family} decoder (config: {shape})")


def hf_decoder_config(config_dict: dict):
    """transformers config of a decoder's config.json dict (defaults filled in): a
    Gemma2Config, LlamaConfig, Qwen2Config, Qwen3Config or Gemma3TextConfig, refused where
    the decoder family computes otherwise."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config_dict.get("model_type")
    family = family_for_hf(model_type)
    cfg = CONFIG_MAPPING[model_type].from_dict(dict(config_dict))  # from_dict adds keys to the dict it is given
    # What HF's class can be set to do and the family's layer does not do.
    if family.activation == "gelu_tanh":
        wanted = {"hidden_activation": "gelu_pytorch_tanh", "attention_bias": False}
    else:
        wanted = {"hidden_act": "silu", "mlp_bias": False, "use_sliding_window": False}
        if not family.qkv_bias:  # Qwen2's q/k/v biases are always there, no setting
            wanted["attention_bias"] = False
    if not family.softcaps:
        wanted.update(attn_logit_softcapping=None, final_logit_softcapping=None)
    if family.name == "gemma3":
        wanted["use_bidirectional_attention"] = False
    refused = [f"{key}={getattr(cfg, key)!r}" for key, value in wanted.items()
               if getattr(cfg, key, value) != value]
    if family.sliding_window:
        pattern = [i for i, kind in enumerate(getattr(cfg, "layer_types", None) or []) if kind == "full_attention"]
        if getattr(cfg, "layer_types", None) and pattern != list(range(family.window_pattern - 1, cfg.num_hidden_layers,
                                                                       family.window_pattern)):
            refused.append(f"layer_types with full attention on layers {pattern}")
    scaling = hf_rope_scaling(cfg)  # refuses scalings no family computes
    if scaling is not None and scaling[0] != family.rope_scaling:
        refused.append(f"rope scaling {scaling[0]!r} factor {scaling[1]}")
    if refused:
        raise ValueError(f"config.json {', '.join(refused)}: the {family.name} decoder family computes "
                         f"{_family_summary(family)}")
    return cfg


def _family_summary(family) -> str:
    """What a family's layer computes, for refusals."""
    parts = ["GeGLU (gelu_pytorch_tanh)" if family.activation == "gelu_tanh" else "SwiGLU (silu)",
             "with biases on q, k and v only" if family.qkv_bias else "without biases",
             f"global attention on every {family.window_pattern}th layer" if family.sliding_window
             else "full attention on every layer",
             f"RoPE scaling {family.rope_scaling!r} or none" if family.rope_scaling else "RoPE without scaling"]
    if not family.softcaps:
        parts.append("no softcaps")
    return ", ".join(parts)


# Llama 3's RoPE scaling ("llama3") as megatron computes it: only the factor may differ.
LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def hf_rope_scaling(hf_cfg) -> Optional[Tuple[str, float]]:
    """(type, factor) of a HF config's RoPE scaling: Llama 3's ("llama3") or linear
    ("linear", Gemma 3's); None without scaling; any other is refused. transformers 4 keeps
    `rope_scaling`, 5 `rope_parameters`."""
    scaling = getattr(hf_cfg, "rope_scaling", None) or getattr(hf_cfg, "rope_parameters", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return None
    odd = {k: scaling.get(k) for k, v in LLAMA3_ROPE.items() if float(scaling.get(k, v)) != v}
    if rope_type not in ("llama3", "linear") or (rope_type == "llama3" and odd):
        raise ValueError(f"config.json rope scaling {scaling}: the decoder computes Llama 3's ('llama3', "
                         f"{LLAMA3_ROPE}, any factor), linear scaling or none")
    return rope_type, float(scaling["factor"])


def hf_rope_theta(hf_cfg) -> float:
    """RoPE base of a HF config: transformers 4 keeps `rope_theta` on the config,
    transformers 5 moved it into `rope_parameters` (both read config.json's top-level
    `rope_theta`, which is what megatron_to_hf writes)."""
    parameters = getattr(hf_cfg, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return float(parameters["rope_theta"])
    return float(hf_cfg.rope_theta)


def decoder_config_from_hf(hf_cfg):
    """The project's `model.decoder` section for a HF decoder config (hf_decoder_config's)."""
    from orchestrator.plan.schema.model import DecoderConfig

    shape = DecoderShape.from_hf_config(hf_cfg)
    common = dict(
        family=shape.family, hidden_size=shape.hidden_size, num_layers=shape.num_layers,
        num_attention_heads=shape.num_heads, num_query_groups=shape.num_kv_heads, kv_channels=shape.head_dim,
        ffn_hidden_size=shape.ffn_hidden_size, vocab_size=shape.vocab_size,
        max_position_embeddings=hf_cfg.max_position_embeddings, rope_theta=hf_rope_theta(hf_cfg),
        norm_eps=hf_cfg.rms_norm_eps, tie_embeddings=shape.tied)
    family = FAMILIES[shape.family]
    scaling = hf_rope_scaling(hf_cfg)
    common["rope_scaling_factor"] = scaling[1] if scaling is not None else None
    if family.local_rope:
        common["rope_local_theta"] = float(hf_cfg.rope_local_base_freq)
    if family.sliding_window:
        return DecoderConfig(**common, sliding_window=hf_cfg.sliding_window,
                             query_pre_attn_scalar=hf_cfg.query_pre_attn_scalar,
                             attn_logit_softcap=hf_cfg.attn_logit_softcapping,
                             final_logit_softcap=hf_cfg.final_logit_softcapping)
    return DecoderConfig(**common, sliding_window=None, query_pre_attn_scalar=None, attn_logit_softcap=None,
                         final_logit_softcap=None)


def decoder_hf_config(decoder: dict, tokenizer_dir: Optional[str] = None) -> dict:
    """HF config (as config.json) of the project's `model.decoder` section, of its family's
    HF class; special-token ids from the tokenizer when there is one."""
    family = family_of(decoder)
    config = {
        "hidden_size": decoder["hidden_size"], "num_hidden_layers": decoder["num_layers"],
        "num_attention_heads": decoder["num_attention_heads"], "num_key_value_heads": decoder["num_query_groups"],
        "head_dim": decoder["kv_channels"], "intermediate_size": decoder["ffn_hidden_size"],
        "vocab_size": decoder["vocab_size"], "max_position_embeddings": decoder["max_position_embeddings"],
        "rope_theta": decoder["rope_theta"], "rms_norm_eps": decoder["norm_eps"],
        "tie_word_embeddings": bool(decoder.get("tie_embeddings", True)),
    }
    config.update({"architectures": [family.hf_architecture], "model_type": family.hf_model_type})
    factor = decoder.get("rope_scaling_factor")
    if family.sliding_window:  # the Gemmas
        config.update({
            "hidden_activation": "gelu_pytorch_tanh", "sliding_window": decoder["sliding_window"],
            # An int where it is one: transformers 5's Gemma2Config refuses a float (HF's own are ints).
            "query_pre_attn_scalar": _int_if_whole(decoder["query_pre_attn_scalar"]),
            "attn_logit_softcapping": decoder["attn_logit_softcap"],
            "final_logit_softcapping": decoder["final_logit_softcap"]})
        if family.local_rope:
            config.update({"rope_local_base_freq": decoder["rope_local_theta"],
                           "rope_scaling": {"rope_type": "linear", "factor": float(factor)}
                           if factor is not None else None,
                           "layer_types": ["full_attention" if (i + 1) % family.window_pattern == 0
                                           else "sliding_attention" for i in range(decoder["num_layers"])]})
    else:
        config.update({"hidden_act": "silu", "attention_bias": family.qkv_bias, "mlp_bias": False,
                       "use_sliding_window": False,
                       "rope_scaling": {"rope_type": "llama3", "factor": float(factor), **LLAMA3_ROPE}
                       if factor is not None else None})
    if tokenizer_dir and (Path(tokenizer_dir) / "tokenizer.json").is_file():
        from orchestrator.data.tokenizer_build import load_tokenizer

        tok = load_tokenizer(tokenizer_dir)
        config.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return config


def _int_if_whole(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value
