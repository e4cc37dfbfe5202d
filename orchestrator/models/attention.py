"""Gemma2 core attention: scaled scores -> logit softcap -> mask -> softmax -> values.

megatron-core's local DotProductAttention cannot express Gemma2: it has no logit
softcap, replaces the given mask by the window mask on sliding-window layers (so
padding and document masks are lost there), builds that mask on a CUDA device and
fills masked scores with -10000. These modules take the same constructor and forward
arguments as megatron's core attention (they plug into `SelfAttentionSubmodules.
core_attention`) and build one mask from all constraints:

- causal;
- sliding window on layers whose 0-based index is even (HF `layer_types`); the window
  counts the current token, so a window W lets query q see keys k with q - W < k <= q;
- documents of a packed sequence (`PackedSeqParams`, `thd` layout, from cu_seqlens);
- the `attention_mask` passed in, if any (megatron convention: True = masked out).

`SoftcapDotProductAttention` is plain PyTorch (CPU and GPU, the reference).
`FlexSoftcapAttention` uses torch's flex_attention (softcap as `score_mod`, masks as a
block mask) for GPU training.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from megatron.core import tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide


def is_sliding_window_layer(layer_number: int) -> bool:
    """`layer_number` is megatron's global 1-based number; Gemma2 windows the layers
    whose 0-based index is even (0, 2, 4, ...)."""
    return (layer_number - 1) % 2 == 0


def document_ids(cu_seqlens: Tensor, total: int) -> Tensor:
    """Index of the packed document each of `total` token slots belongs to."""
    positions = torch.arange(total, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].to(positions.dtype), positions, right=True)


def allowed_attention(
    sq: int,
    sk: int,
    device,
    window: Optional[int],
    cu_seqlens: Optional[Tensor] = None,
    attention_mask: Optional[Tensor] = None,
) -> Tensor:
    """Boolean [b|1, 1, sq, sk] mask, True where query i may attend key j."""
    if sq != sk:
        raise ValueError(f"training attention needs equal query ({sq}) and key ({sk}) lengths")
    q = torch.arange(sq, device=device)[:, None]
    k = torch.arange(sk, device=device)[None, :]
    allowed = k <= q
    if window is not None:
        allowed = allowed & (q - k < window)
    if cu_seqlens is not None:
        doc = document_ids(cu_seqlens.to(device), sq)
        allowed = allowed & (doc[:, None] == doc[None, :])
    allowed = allowed[None, None]
    if attention_mask is not None:
        allowed = allowed & ~attention_mask.to(device=device, dtype=torch.bool)
    return allowed


class _Gemma2CoreAttentionBase(MegatronModule):
    """Shared set-up: per-partition head counts, scale, softcap and window of a layer."""

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection=None,
    ):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError(
                f"context_parallel_size={config.context_parallel_size}: the Gemma2 core attention "
                "does not implement context parallelism; use cp=1"
            )
        if attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
            raise ValueError(f"Gemma2 attention is causal; got attn_mask_type={attn_mask_type}")
        if pg_collection is None:
            from megatron.core.process_groups_config import ProcessGroupCollection

            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp_size = pg_collection.tp.size()
        self.layer_number = layer_number
        self.heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.groups_per_partition = divide(config.num_query_groups, tp_size)
        self.hidden_per_partition = self.heads_per_partition * config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else config.kv_channels**-0.5
        self.softcap = getattr(config, "attn_logit_softcapping", None)
        sliding_window = getattr(config, "sliding_window", None)
        self.window = sliding_window if sliding_window and is_sliding_window_layer(layer_number) else None
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Optional[Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
    ) -> Tensor:
        if attention_bias is not None:
            raise ValueError("Gemma2 attention takes no attention_bias")
        packed = packed_seq_params is not None
        if packed:  # thd: [t, heads, dim] -> [t, 1, heads, dim]
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        context = self._attend(query, key, value, attention_mask, self._packed_boundaries(packed_seq_params))
        return context.squeeze(1) if packed else context

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                cu_seqlens: Optional[Tensor]) -> Tensor:
        """[sq, b, heads, dim] each -> context [sq, b, hidden per partition]."""
        raise NotImplementedError

    @staticmethod
    def _packed_boundaries(packed_seq_params: Optional[PackedSeqParams]) -> Optional[Tensor]:
        if packed_seq_params is None:
            return None
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(
                f"packed sequences need qkv_format='thd' (got {packed_seq_params.qkv_format!r})"
            )
        if packed_seq_params.cu_seqlens_q_padded is not None:
            return packed_seq_params.cu_seqlens_q_padded
        return packed_seq_params.cu_seqlens_q


class SoftcapDotProductAttention(_Gemma2CoreAttentionBase):
    """Plain-PyTorch Gemma2 core attention (the reference path; runs on CPU)."""

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                cu_seqlens: Optional[Tensor]) -> Tensor:
        sq, b = query.shape[0], query.shape[1]
        rep = self.heads_per_partition // self.groups_per_partition
        if rep > 1:  # grouped-query attention: head h reads key/value group h // rep
            key = key.repeat_interleave(rep, dim=2)
            value = value.repeat_interleave(rep, dim=2)
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        k = key.permute(1, 2, 3, 0)  # [b, np, hn, sk]
        v = value.permute(1, 2, 0, 3)  # [b, np, sk, hn]
        scores = torch.matmul(q, k).float() * self.softmax_scale
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        allowed = allowed_attention(sq, key.shape[0], scores.device, self.window, cu_seqlens, attention_mask)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        if self.dropout_p > 0 and self.training:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                probs = torch.nn.functional.dropout(probs, p=self.dropout_p)
        context = torch.matmul(probs, v)  # [b, np, sq, hn]
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_per_partition)


_BLOCK_MASKS: dict = {}
_BLOCK_MASK_CACHE_SIZE = 16


class FlexSoftcapAttention(_Gemma2CoreAttentionBase):
    """Gemma2 core attention on torch's flex_attention: the softcap is a `score_mod`
    (applied to the scaled score, before masking, as in HF) and causal + window +
    document + given masks form one `mask_mod`. Compiled on GPU; the forward also
    runs eagerly on CPU (torch refuses its backward there)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        try:
            from torch.nn.attention import flex_attention as flex_module
        except ImportError as err:  # pragma: no cover - depends on the torch build
            raise ImportError("backend 'te' needs torch.nn.attention.flex_attention (torch >= 2.5)") from err
        self._flex = flex_module
        self._kernel = None

    def _attention_kernel(self, device: torch.device):
        if self._kernel is None:
            kernel = self._flex.flex_attention
            self._kernel = torch.compile(kernel, dynamic=False) if device.type == "cuda" else kernel
        return self._kernel

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                cu_seqlens: Optional[Tensor]) -> Tensor:
        sq, b = query.shape[0], query.shape[1]
        device = query.device
        window = self.window
        cap = self.softcap
        doc = None
        if cu_seqlens is not None:
            doc = document_ids(cu_seqlens.to(device), sq)
        extra = None if attention_mask is None else ~attention_mask.to(device=device, dtype=torch.bool)

        def mask_mod(batch, head, q_idx, kv_idx):
            keep = kv_idx <= q_idx
            if window is not None:
                keep = keep & (q_idx - kv_idx < window)
            if doc is not None:
                keep = keep & (doc[q_idx] == doc[kv_idx])
            if extra is not None:
                keep = keep & extra[batch if extra.shape[0] > 1 else 0, 0, q_idx, kv_idx]
            return keep

        def score_mod(score, batch, head, q_idx, kv_idx):
            return torch.tanh(score / cap) * cap

        # Block masks depend only on lengths, window and documents: build each once and
        # share it between layers and steps (not when an explicit attention_mask is given).
        cache_key = None
        if extra is None:
            docs = None if cu_seqlens is None else tuple(cu_seqlens.tolist())
            cache_key = (sq, key.shape[0], window, docs, str(device))
        block_mask = _BLOCK_MASKS.get(cache_key) if cache_key is not None else None
        if block_mask is None:
            block_mask = self._flex.create_block_mask(
                mask_mod, B=b if extra is not None and extra.shape[0] > 1 else None, H=None,
                Q_LEN=sq, KV_LEN=key.shape[0], device=device,
            )
            if cache_key is not None:
                if len(_BLOCK_MASKS) >= _BLOCK_MASK_CACHE_SIZE:
                    _BLOCK_MASKS.pop(next(iter(_BLOCK_MASKS)))
                _BLOCK_MASKS[cache_key] = block_mask
        out = self._attention_kernel(device)(
            query.permute(1, 2, 0, 3), key.permute(1, 2, 0, 3), value.permute(1, 2, 0, 3),
            score_mod=score_mod if cap is not None else None, block_mask=block_mask,
            scale=self.softmax_scale, enable_gqa=self.heads_per_partition != self.groups_per_partition,
        )
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_per_partition)
