"""Per-rank megatron tensors from a full (TP=1, PP=1) state dict, for tests that load
a model directly at a given layout (the product loads through dist_checkpointing,
which reshards by itself: orchestrator/train/init_weights.py).

TP split (rank r of T): linear_qkv (weight and bias) by KV groups (dim 0), fc1 as [gate_r; up_r],
linear_proj and fc2 along dim 1, embedding rows along dim 0; norms (QK-norms too) replicated. PP
split: stage p holds layers [p*L/P, (p+1)*L/P) renumbered from 0; the first stage holds
the embedding, the last the final norm and `output_layer.weight`: the untied output
layer, or (when P > 1) the tied copy of the embedding.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from orchestrator.convert.decoder_mapping import DecoderShape, hf_to_megatron_tensors
from orchestrator.plan.megatron_args import padded_vocab_size


def hf_to_megatron_full(hf: Dict[str, torch.Tensor], shape: DecoderShape) -> Dict[str, torch.Tensor]:
    """HF Gemma2 state dict -> {megatron name: tensor} at TP=1, PP=1 (unpadded vocab)."""
    return dict(hf_to_megatron_tensors(hf, shape))


def _tp_split(name: str, tensor: torch.Tensor, tp: int):
    """Per-rank pieces of one full megatron tensor (list of length tp)."""
    if tp == 1:
        return [tensor]
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight")) or name == "output_layer.weight":
        return [t.contiguous() for t in torch.chunk(tensor, tp, dim=0)]
    if name.endswith("linear_fc1.weight"):
        gate, up = torch.chunk(tensor, 2, dim=0)
        return [torch.cat([gc, uc], dim=0) for gc, uc in zip(torch.chunk(gate, tp, 0), torch.chunk(up, tp, 0))]
    if name.endswith("linear_proj.weight") or name.endswith("linear_fc2.weight"):
        return [t.contiguous() for t in torch.chunk(tensor, tp, dim=1)]
    return [tensor] * tp  # norms: replicated



def _padded(rows: torch.Tensor, padded: int) -> torch.Tensor:
    """Vocabulary rows padded with zeros to `padded`."""
    if padded > rows.shape[0]:
        rows = torch.cat([rows, rows.new_zeros(padded - rows.shape[0], rows.shape[1])], dim=0)
    return rows


def shard_megatron(full: Dict[str, torch.Tensor], shape: DecoderShape, tp: int, pp: int
                   ) -> Dict[Tuple[int, int], Dict[str, torch.Tensor]]:
    """TP=1 megatron state dict (unpadded) -> {(tp_rank, pp_rank): state dict of that rank}."""
    padded = padded_vocab_size(shape.vocab_size, tp)
    emb = _padded(full["embedding.word_embeddings.weight"], padded)
    per_stage = shape.num_layers // pp
    shards: Dict[Tuple[int, int], Dict[str, torch.Tensor]] = {(t, p): {} for t in range(tp) for p in range(pp)}
    for p in range(pp):
        stage: Dict[str, torch.Tensor] = {}
        if p == 0:
            stage["embedding.word_embeddings.weight"] = emb
        if p == pp - 1:
            stage["decoder.final_layernorm.weight"] = full["decoder.final_layernorm.weight"]
            if not shape.tied:
                stage["output_layer.weight"] = _padded(full["output_layer.weight"], padded)
            elif pp > 1:
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
