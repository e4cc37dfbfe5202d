"""Gemma2 weights: HF names <-> megatron-core names, and TP/PP sharding.

Pure tensor code (no model is built). Layouts, per layer i:

  HF model.layers.i.                      megatron decoder.layers.i.
  input_layernorm                         input_layernorm
  self_attn.{q,k,v}_proj                  self_attention.linear_qkv   rows grouped per KV group:
                                                                      [q heads of group g; k_g; v_g] for g = 0..G-1
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

TP split (rank r of T): linear_qkv by KV groups (dim 0), fc1 as [gate_r; up_r],
linear_proj and fc2 along dim 1, embedding rows along dim 0; norms replicated.
PP split: stage p holds layers [p*L/P, (p+1)*L/P) renumbered from 0; the first stage
holds the embedding, the last the final norm and (when P > 1) `output_layer.weight`,
the tied copy of the embedding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

import torch

from orchestrator.megatron_args import padded_vocab_size

LAYER_NORMS = {
    "input_layernorm": "input_layernorm",
    "post_attention_layernorm": "post_attention_layernorm",
    "pre_feedforward_layernorm": "pre_mlp_layernorm",
    "post_feedforward_layernorm": "post_mlp_layernorm",
}


@dataclass(frozen=True)
class Gemma2Shape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int

    @classmethod
    def from_hf_config(cls, cfg) -> "Gemma2Shape":
        get = cfg.get if isinstance(cfg, dict) else lambda k: getattr(cfg, k)
        return cls(get("num_hidden_layers"), get("hidden_size"), get("num_attention_heads"),
                   get("num_key_value_heads"), get("head_dim"), get("intermediate_size"), get("vocab_size"))


def hf_to_megatron_full(hf: Dict[str, torch.Tensor], shape: Gemma2Shape) -> Dict[str, torch.Tensor]:
    """HF Gemma2 state dict -> megatron names at TP=1, PP=1 (unpadded vocab)."""
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    g, rep, d = shape.num_kv_heads, shape.num_heads // shape.num_kv_heads, shape.head_dim
    for i in range(shape.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for hf_name, mg_name in LAYER_NORMS.items():
            out[dst + mg_name + ".weight"] = hf[src + hf_name + ".weight"]
        q = hf[src + "self_attn.q_proj.weight"].reshape(g, rep * d, -1)
        k = hf[src + "self_attn.k_proj.weight"].reshape(g, d, -1)
        v = hf[src + "self_attn.v_proj.weight"].reshape(g, d, -1)
        out[dst + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, shape.hidden_size)
        out[dst + "self_attention.linear_proj.weight"] = hf[src + "self_attn.o_proj.weight"]
        out[dst + "mlp.linear_fc1.weight"] = torch.cat(
            [hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]], dim=0)
        out[dst + "mlp.linear_fc2.weight"] = hf[src + "mlp.down_proj.weight"]
    return out


def megatron_full_to_hf(mg: Dict[str, torch.Tensor], shape: Gemma2Shape) -> Dict[str, torch.Tensor]:
    """Inverse of `hf_to_megatron_full` (expects the unpadded vocab)."""
    out = {"model.embed_tokens.weight": mg["embedding.word_embeddings.weight"],
           "model.norm.weight": mg["decoder.final_layernorm.weight"]}
    g, rep, d = shape.num_kv_heads, shape.num_heads // shape.num_kv_heads, shape.head_dim
    for i in range(shape.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        for hf_name, mg_name in LAYER_NORMS.items():
            out[dst + hf_name + ".weight"] = mg[src + mg_name + ".weight"]
        qkv = mg[src + "self_attention.linear_qkv.weight"].reshape(g, (rep + 2) * d, -1)
        q, k, v = torch.split(qkv, [rep * d, d, d], dim=1)
        out[dst + "self_attn.q_proj.weight"] = q.reshape(-1, shape.hidden_size).contiguous()
        out[dst + "self_attn.k_proj.weight"] = k.reshape(-1, shape.hidden_size).contiguous()
        out[dst + "self_attn.v_proj.weight"] = v.reshape(-1, shape.hidden_size).contiguous()
        out[dst + "self_attn.o_proj.weight"] = mg[src + "self_attention.linear_proj.weight"]
        gate, up = torch.chunk(mg[src + "mlp.linear_fc1.weight"], 2, dim=0)
        out[dst + "mlp.gate_proj.weight"] = gate.contiguous()
        out[dst + "mlp.up_proj.weight"] = up.contiguous()
        out[dst + "mlp.down_proj.weight"] = mg[src + "mlp.linear_fc2.weight"]
    return out


def _tp_split(name: str, tensor: torch.Tensor, tp: int):
    """Per-rank pieces of one full megatron tensor (list of length tp)."""
    if tp == 1:
        return [tensor]
    if name.endswith("linear_qkv.weight") or name.endswith("word_embeddings.weight") or name == "output_layer.weight":
        return [t.contiguous() for t in torch.chunk(tensor, tp, dim=0)]
    if name.endswith("linear_fc1.weight"):
        gate, up = torch.chunk(tensor, 2, dim=0)
        return [torch.cat([gc, uc], dim=0) for gc, uc in zip(torch.chunk(gate, tp, 0), torch.chunk(up, tp, 0))]
    if name.endswith("linear_proj.weight") or name.endswith("linear_fc2.weight"):
        return [t.contiguous() for t in torch.chunk(tensor, tp, dim=1)]
    return [tensor] * tp  # norms: replicated


def _tp_merge(name: str, pieces):
    if len(pieces) == 1:
        return pieces[0]
    if name.endswith("linear_qkv.weight") or name.endswith("word_embeddings.weight") or name == "output_layer.weight":
        return torch.cat(pieces, dim=0)
    if name.endswith("linear_fc1.weight"):
        halves = [torch.chunk(p, 2, dim=0) for p in pieces]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    if name.endswith("linear_proj.weight") or name.endswith("linear_fc2.weight"):
        return torch.cat(pieces, dim=1)
    return pieces[0]


def check_divisibility(shape: Gemma2Shape, tp: int, pp: int) -> None:
    problems = []
    if shape.num_kv_heads % tp:
        problems.append(f"num_key_value_heads ({shape.num_kv_heads}) is not divisible by tp ({tp})")
    if shape.num_heads % tp:
        problems.append(f"num_attention_heads ({shape.num_heads}) is not divisible by tp ({tp})")
    if shape.ffn_hidden_size % tp:
        problems.append(f"intermediate_size ({shape.ffn_hidden_size}) is not divisible by tp ({tp})")
    if shape.num_layers % pp:
        problems.append(f"num_hidden_layers ({shape.num_layers}) is not divisible by pp ({pp})")
    if problems:
        raise ValueError("cannot shard Gemma2 for tp=%d, pp=%d: %s" % (tp, pp, "; ".join(problems)))


def shard_megatron(full: Dict[str, torch.Tensor], shape: Gemma2Shape, tp: int, pp: int
                   ) -> Dict[Tuple[int, int], Dict[str, torch.Tensor]]:
    """TP=1 megatron state dict (unpadded) -> {(tp_rank, pp_rank): state dict of that rank}."""
    check_divisibility(shape, tp, pp)
    padded = padded_vocab_size(shape.vocab_size, tp)
    emb = full["embedding.word_embeddings.weight"]
    if padded > emb.shape[0]:
        emb = torch.cat([emb, emb.new_zeros(padded - emb.shape[0], emb.shape[1])], dim=0)
    per_stage = shape.num_layers // pp
    shards: Dict[Tuple[int, int], Dict[str, torch.Tensor]] = {(t, p): {} for t in range(tp) for p in range(pp)}
    for p in range(pp):
        stage: Dict[str, torch.Tensor] = {}
        if p == 0:
            stage["embedding.word_embeddings.weight"] = emb
        if p == pp - 1:
            stage["decoder.final_layernorm.weight"] = full["decoder.final_layernorm.weight"]
            if pp > 1:
                stage["output_layer.weight"] = emb
        for local in range(per_stage):
            prefix = f"decoder.layers.{p * per_stage + local}."
            for name, tensor in full.items():
                if name.startswith(prefix):
                    stage[f"decoder.layers.{local}." + name[len(prefix):]] = tensor
        for name, tensor in stage.items():
            for t, piece in enumerate(_tp_split(name, tensor, tp)):
                shards[(t, p)][name] = piece
    return shards


def unshard_megatron(shards: Dict[Tuple[int, int], Dict[str, torch.Tensor]], shape: Gemma2Shape
                     ) -> Dict[str, torch.Tensor]:
    """Inverse of `shard_megatron`: per-rank dicts -> TP=1 PP=1 dict with the vocab unpadded."""
    tp = 1 + max(t for t, _ in shards)
    pp = 1 + max(p for _, p in shards)
    per_stage = shape.num_layers // pp
    full: Dict[str, torch.Tensor] = {}
    for p in range(pp):
        for name in shards[(0, p)]:
            if name == "output_layer.weight":
                continue  # the tied copy of the embedding
            merged = _tp_merge(name, [shards[(t, p)][name] for t in range(tp)])
            if name.startswith("decoder.layers."):
                local, rest = name[len("decoder.layers."):].split(".", 1)
                name = f"decoder.layers.{p * per_stage + int(local)}.{rest}"
            full[name] = merged
    full["embedding.word_embeddings.weight"] = full["embedding.word_embeddings.weight"][: shape.vocab_size].contiguous()
    return full


def hf_gemma2_config(config_dict: dict):
    """transformers Gemma2Config of a config.json dict (defaults filled in)."""
    from transformers import Gemma2Config

    if config_dict.get("model_type") != "gemma2":
        raise ValueError(f"config.json has model_type {config_dict.get('model_type')!r}; only 'gemma2' converts")
    cfg = Gemma2Config.from_dict(config_dict)
    if cfg.hidden_activation != "gelu_pytorch_tanh":
        raise ValueError(f"config.json hidden_activation {cfg.hidden_activation!r}: the decoder implements "
                         "Gemma2's 'gelu_pytorch_tanh' only")
    return cfg


def decoder_config_from_hf(hf_cfg):
    """The project's `model.decoder` section for a HF Gemma2Config."""
    from orchestrator.schema.model import DecoderConfig

    return DecoderConfig(
        hidden_size=hf_cfg.hidden_size, num_layers=hf_cfg.num_hidden_layers,
        num_attention_heads=hf_cfg.num_attention_heads, num_query_groups=hf_cfg.num_key_value_heads,
        kv_channels=hf_cfg.head_dim, ffn_hidden_size=hf_cfg.intermediate_size, vocab_size=hf_cfg.vocab_size,
        max_position_embeddings=hf_cfg.max_position_embeddings, rope_theta=hf_cfg.rope_theta,
        norm_eps=hf_cfg.rms_norm_eps, sliding_window=hf_cfg.sliding_window,
        query_pre_attn_scalar=hf_cfg.query_pre_attn_scalar, attn_logit_softcap=hf_cfg.attn_logit_softcapping,
        final_logit_softcap=hf_cfg.final_logit_softcapping, tie_embeddings=True,
    )
