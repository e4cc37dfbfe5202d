"""Key/value cache of the Gemma2 decoder for incremental (greedy) decoding.

    cache = KVCache(capacity=prompt_width + max_new_tokens)
    with decoding(language_model, cache):
        cache.begin(positions, real, inv_freqs)  # before each decoder forward
        language_model.decoder(hidden_states=..., attention_mask=None)

While `decoding` is active, every Gemma2 core attention of the language model
(orchestrator.models.attention) takes its layer's cache from `cache` and, for the new
columns of this forward (the whole prompt at prefill, one token per row after it):

1. applies RoPE to queries and keys at each column's own position (`DecodeStep`: the
   positions are per row, so prompts of different lengths, padded left or right, keep
   the positions they have alone; megatron's rotary path is bypassed: the decoder is
   called without `rotary_pos_emb`);
2. attends the queries to the cached keys plus the new ones, with a mask on positions:
   causal, the sliding window on windowed layers, and no padding column;
3. stores the new real keys and values.

What a layer keeps. A global layer keeps every position (slot = position, `capacity`
slots). A sliding-window layer keeps only what its window can still see: a query at
position q sees keys q-W+1 .. q, the newest of which arrives with the query itself, so
W-1 slots in a ring (slot = position mod W-1) hold all it needs; at the prefill the
prompt's own keys are attended before the ring is filled with each row's last W-1.
Each slot remembers the position it holds (-1: empty), which the mask reads.

Sequence parallelism is switched off while decoding (one new token per row is no
sequence to split; megatron's own inference does the same): `decoding` sets the
config's and the modules' `sequence_parallel` to False and restores them after.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Optional

import torch
from torch import Tensor


class DecodeStep:
    """One decoder forward while decoding: the new columns' positions [b, s] and whether
    each is a real token [b, s] (False: padding, neither attended nor stored), plus
    RoPE's cos and sin at those positions [s, b, 1, dim], made once for all layers: of the
    model's rotary frequencies and, for Gemma 3's sliding layers, of its local ones
    (`inv_freqs`: DecoderModel.rotary_inv_freqs)."""

    def __init__(self, positions: Tensor, real: Tensor, inv_freqs: tuple):
        self.positions = positions
        self.real = real
        self.cos_sin = [None if f is None else self._cos_sin(positions, f) for f in inv_freqs]

    @staticmethod
    def _cos_sin(positions: Tensor, inv_freq: Tensor) -> tuple:
        # As megatron's RotaryEmbedding (non-interleaved): angles in fp32, halves repeated.
        freqs = positions.t().to(inv_freq.dtype)[..., None] * inv_freq  # [s, b, dim/2]
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(2)  # [s, b, 1, dim]
        return torch.cos(emb), torch.sin(emb)

    def rotate(self, t: Tensor, local: bool = False) -> Tensor:
        """RoPE on [s, b, heads, dim] (megatron's `_apply_rotary_pos_emb_bshd`, HF's
        `apply_rotary_pos_emb`: cos and sin cast to t's dtype, rotate-half), with the local
        frequencies where `local`."""
        cos, sin = self.cos_sin[1 if local else 0]
        x1, x2 = torch.chunk(t, 2, dim=-1)
        return t * cos.to(t.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(t.dtype)


class LayerCache:
    """One layer's keys and values [b, slots, groups, dim] and the position each slot
    holds [b, slots] (-1: empty). `ring` (sliding-window layers): slot = position mod
    slots, and only a row's last `slots` positions of a forward are stored."""

    def __init__(self, like: Tensor, batch: int, slots: int, ring: bool):
        groups, dim = like.shape[2], like.shape[3]
        self.keys = like.new_zeros((batch, slots, groups, dim))
        self.values = like.new_zeros((batch, slots, groups, dim))
        self.positions = torch.full((batch, slots), -1, dtype=torch.long, device=like.device)
        self.ring = ring

    def with_new(self, key: Tensor, value: Tensor, step: DecodeStep):
        """Cached plus new keys and values [b, slots + s, groups, dim] and their positions
        [b, slots + s] (-1 where nothing is held or the new column is padding)."""
        new_positions = step.positions.masked_fill(~step.real, -1)
        return (torch.cat([self.keys, key.transpose(0, 1)], dim=1),
                torch.cat([self.values, value.transpose(0, 1)], dim=1),
                torch.cat([self.positions, new_positions], dim=1))

    def store(self, key: Tensor, value: Tensor, step: DecodeStep) -> None:
        slots = self.keys.shape[1]
        keep = step.real
        if self.ring:  # only the last `slots` real positions of each row: distinct slots
            newest = step.positions.masked_fill(~step.real, -1).max(dim=1, keepdim=True).values
            keep = keep & (step.positions > newest - slots)
        rows, cols = torch.nonzero(keep, as_tuple=True)
        at = step.positions[rows, cols]
        if self.ring:
            at = at % slots
        elif at.numel() and int(at.max()) >= slots:
            raise ValueError(f"position {int(at.max())} is past the KV cache's capacity ({slots} positions)")
        self.keys[rows, at] = key[cols, rows]
        self.values[rows, at] = value[cols, rows]
        self.positions[rows, at] = step.positions[rows, cols]


class KVCache:
    """The caches of every layer of one decoding run (a batch of prompts), made at the
    prefill from the first keys each layer sees. `capacity`: the positions a row may
    reach (longest prompt + new tokens)."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"KV cache capacity must be >= 1 (got {capacity})")
        self.capacity = capacity
        self.layers: Dict[int, LayerCache] = {}
        self.step: Optional[DecodeStep] = None

    def begin(self, positions: Tensor, real: Tensor, inv_freqs: tuple) -> None:
        """The next forward's new columns (see DecodeStep)."""
        self.step = DecodeStep(positions, real, inv_freqs)

    def layer(self, number: int, window: Optional[int], like: Tensor) -> LayerCache:
        cache = self.layers.get(number)
        if cache is None:
            ring = window is not None and window - 1 < self.capacity
            slots = max(1, window - 1) if ring else self.capacity
            cache = self.layers[number] = LayerCache(like, like.shape[1], slots, ring)
        return cache


@contextmanager
def decoding(language_model: torch.nn.Module, cache: KVCache):
    """Within: the language model's core attentions decode with `cache` and sequence
    parallelism is off (restored on exit, also on error)."""
    from orchestrator.models.attention import CoreAttentionBase

    attentions = [m for m in language_model.modules() if isinstance(m, CoreAttentionBase)]
    split = [m for m in language_model.modules() if getattr(m, "sequence_parallel", None) is True]
    config = language_model.config
    config_sp = config.sequence_parallel
    for module in attentions:
        module.kv_cache = cache
    for module in split:
        module.sequence_parallel = False
    config.sequence_parallel = False
    try:
        yield cache
    finally:
        config.sequence_parallel = config_sp
        for module in split:
            module.sequence_parallel = True
        for module in attentions:
            module.kv_cache = None
