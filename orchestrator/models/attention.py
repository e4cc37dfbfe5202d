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

Context parallelism (CP ranks each hold chunks r and 2*CP-1-r of every row, megatron's
load-balanced layout; orchestrator.data.context_parallel): each rank all-gathers the
keys and values of its CP group (autograd: all-gather forward, reduce-scatter backward),
puts them in global order and attends its own queries to the whole row, with causal,
window and document masks on global slot indices (`q_slots`). This is Llama 3's choice
over a ring: the mask is any function of global positions, so softcap, sliding window,
packed documents and GQA stay exact with no per-step bookkeeping, and the attention
kernel is the same. Its cost per layer and rank: K/V gathered once (Gemma2's GQA makes
them small: 2 x groups x head_dim values a token, e.g. 2048 for Gemma2-2B against a
2304 hidden), i.e. (CP-1)/CP of the row's K/V received forward and their gradients
reduce-scattered backward, and the full row's K/V held for the backward (queries,
scores and everything outside attention stay at 1/CP). A ring would hold 2/CP of the
K/V but pass CP-1 messages a layer and need the mask and softcap per block pair; at the
CP sizes one node holds (2-8) the gathered K/V are a small share of a layer's
activations. Megatron-LM calls this algorithm `--cp-comm-type all_gather`. An explicit
`attention_mask` under CP is [b|1, 1, local queries, row length] with keys in global
order (orchestrator.train.audiollm_provider builds it for packed rows).

`SoftcapDotProductAttention` is plain PyTorch (CPU and GPU, the reference).
`FlexSoftcapAttention` uses torch's flex_attention (softcap as `score_mod`, masks as a
block mask) for GPU training. Two decisions make it fit training, where every micro-batch
has its own width (columns trimmed to the used ones) and evaluation uses still others
(decoding with the KV cache attends in plain PyTorch whatever the kernel: `_attend_cached`):

- Bucketed widths. The kernel is compiled with static shapes (`dynamic=False`), one
  compilation per shape. q, k, v are padded to `flex_bucket_width(width)` — the next
  power of two, at least 128 — and the output sliced back; the mask hides the padding,
  so the padded blocks are skipped and cost no attention work. The kernel then sees a
  small set known in advance (buckets x window or not x mask source x training or
  evaluation), and its recompile limit is raised to cover that set
  (`FLEX_RECOMPILE_LIMIT`, 132): past dynamo's default of 8 it would silently run
  uncompiled, materialising [b, heads, s, s] fp32 scores. The real length enters the
  mask as a 0-dim tensor, not a Python int, so that it is no compile-time constant.
- Block masks once per micro-batch, not per layer. Every layer of a micro-batch gets the
  same documents (`cu_seqlens`) or `attention_mask` tensor; the first layer of each
  window variant (windowed, global) builds the block mask and the other layers reuse it,
  found through a weak reference to that tensor's storage (it survives the detached copy
  that activation recomputation passes), with no host sync. Without documents or mask
  the block mask depends on (bucket, real length, window, device) only and is cached
  by that.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from megatron.core import tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.utils import divide


def is_sliding_window_layer(layer_number: int, pattern: int = 2) -> bool:
    """`layer_number` is megatron's global 1-based number; every `pattern`-th layer attends
    globally, the others in the window (HF layer_types): Gemma2 (pattern 2) windows the
    layers whose 0-based index is even (0, 2, 4, ...), Gemma 3 (6) all but 5, 11, ..."""
    return layer_number % pattern != 0


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
    q_slots: Optional[Tensor] = None,
) -> Tensor:
    """Boolean [b|1, 1, sq, sk] mask, True where query i may attend key j. `q_slots`: the
    global slot of each query when it holds only part of the row (context parallel;
    keys are the whole row), else queries and keys are the same slots."""
    if q_slots is None and sq != sk:
        raise ValueError(f"training attention needs equal query ({sq}) and key ({sk}) lengths")
    q = (torch.arange(sq, device=device) if q_slots is None else q_slots.to(device))[:, None]
    k = torch.arange(sk, device=device)[None, :]
    allowed = k <= q
    if window is not None:
        allowed = allowed & (q - k < window)
    if cu_seqlens is not None:
        doc = document_ids(cu_seqlens.to(device), sk)
        allowed = allowed & (doc[q] == doc[None, :])
    allowed = allowed[None, None]
    if attention_mask is not None:
        allowed = allowed & ~attention_mask.to(device=device, dtype=torch.bool)
    return allowed


class CoreAttentionBase(MegatronModule):
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
        if cp_comm_type not in (None, "all_gather"):
            raise ValueError(f"cp_comm_type={cp_comm_type!r}: the Gemma2 attention gathers keys and values "
                             f"over the context-parallel group ('all_gather')")
        if attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
            raise ValueError(f"Gemma2 attention is causal; got attn_mask_type={attn_mask_type}")
        if pg_collection is None:
            from megatron.core.process_groups_config import ProcessGroupCollection

            pg_collection = ProcessGroupCollection.use_mpu_process_groups(
                required_pgs=["tp", "cp"] if config.context_parallel_size > 1 else ["tp"])
        tp_size = pg_collection.tp.size()
        self.cp_group = pg_collection.cp if config.context_parallel_size > 1 else None
        self.layer_number = layer_number
        self.heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.groups_per_partition = divide(config.num_query_groups, tp_size)
        self.hidden_per_partition = self.heads_per_partition * config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else config.kv_channels**-0.5
        self.softcap = getattr(config, "attn_logit_softcapping", None)
        sliding_window = getattr(config, "sliding_window", None)
        sliding = is_sliding_window_layer(layer_number, getattr(config, "window_pattern", 2))
        self.window = sliding_window if sliding_window and sliding else None
        # Gemma 3: a sliding layer rotates with the local RoPE base (what the KV cache's
        # decoding applies here; in training the layer picks its rotary table).
        self.local_rope = sliding and getattr(config, "rope_local_theta", None) is not None
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        # Set while decoding (orchestrator.models.kv_cache.decoding): attend through the cache.
        self.kv_cache = None

    def prepare_mask(self, attention_mask: Optional[Tensor], packed_seq_params: Optional[PackedSeqParams],
                     local_length: int, device: torch.device):
        """What this layer's attention takes as its mask, made before a compiled layer runs
        (orchestrator.models.compile): the reference attention builds its mask from the
        tensors inside the graph, so the mask passes unchanged."""
        return attention_mask

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
        if self.kv_cache is not None:
            return self._attend_cached(query, key, value)
        packed = packed_seq_params is not None
        q_slots = None
        if self.cp_group is not None:
            if packed:
                raise ValueError("context parallel attention takes [s, b] rows (packed documents as an "
                                 "attention_mask), not packed_seq_params (thd)")
            key, value, q_slots = self._gather_row(key, value)
        if packed:  # thd: [t, heads, dim] -> [t, 1, heads, dim]
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        context = self._attend(query, key, value, attention_mask, self._packed_boundaries(packed_seq_params),
                               q_slots)
        return context.squeeze(1) if packed else context

    def _gather_row(self, key: Tensor, value: Tensor):
        """Context parallel: this rank's [s/cp, b, groups, dim] keys and values -> the whole
        row's, in global slot order, and the global slot of each of this rank's queries."""
        order, slots = _cp_layout(key.shape[0], self.cp_group.size(), self.cp_group.rank(), key.device)
        key, value = (tensor_parallel.gather_from_sequence_parallel_region(t, group=self.cp_group)
                      for t in (key, value))
        return key.index_select(0, order), value.index_select(0, order), slots

    def _attend_cached(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """Decoding (orchestrator.models.kv_cache): RoPE at the step's positions, the
        queries attend the cached and new keys (causal, window and padding by position),
        the new keys and values are stored. Plain PyTorch whatever the kernel: one query
        per row after the prefill, and the mask is per row. No context-parallel gather:
        a context-parallel rank decodes whole rows with its full copy of the weights."""
        step = self.kv_cache.step
        query, key = step.rotate(query, self.local_rope), step.rotate(key, self.local_rope)
        cache = self.kv_cache.layer(self.layer_number, self.window, key)
        keys, values, key_positions = cache.with_new(key, value, step)  # [b, n, g, d], [b, n]
        cache.store(key, value, step)
        sq, b = query.shape[0], query.shape[1]
        rep = self.heads_per_partition // self.groups_per_partition
        if rep > 1:
            keys, values = keys.repeat_interleave(rep, dim=2), values.repeat_interleave(rep, dim=2)
        q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
        scores = torch.matmul(q, keys.permute(0, 2, 3, 1)).float() * self.softmax_scale  # [b, np, sq, n]
        if self.softcap is not None:
            scores = torch.tanh(scores / self.softcap) * self.softcap
        q_pos, k_pos = step.positions[:, :, None], key_positions[:, None, :]
        allowed = (k_pos >= 0) & (k_pos <= q_pos)
        if self.window is not None:
            allowed = allowed & (q_pos - k_pos < self.window)
        scores = scores.masked_fill(~allowed[:, None], torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1).to(values.dtype)
        context = torch.matmul(probs, values.permute(0, 2, 1, 3))  # [b, np, sq, hn]
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_per_partition)

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                cu_seqlens: Optional[Tensor], q_slots: Optional[Tensor]) -> Tensor:
        """[sq, b, heads, dim] queries, [sk, b, groups, dim] keys and values (sk = sq, or
        the whole row under CP with `q_slots` the queries' global slots) -> context
        [sq, b, hidden per partition]."""
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


@functools.lru_cache(maxsize=64)
def _cp_layout(local_length: int, cp_size: int, cp_rank: int, device: torch.device) -> tuple:
    """(order that puts the all-gathered keys in global slot order, global slot of each of
    this rank's queries), on `device`: made once per (length, layout, device), not per
    layer and micro-batch. Read-only tensors."""
    from orchestrator.data.context_parallel import gathered_order, rank_slots

    return (gathered_order(local_length, cp_size).to(device),
            rank_slots(local_length, cp_size, cp_rank).to(device))


class SoftcapDotProductAttention(CoreAttentionBase):
    """Plain-PyTorch Gemma2 core attention (the reference path; runs on CPU)."""

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                cu_seqlens: Optional[Tensor], q_slots: Optional[Tensor]) -> Tensor:
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
        allowed = allowed_attention(sq, key.shape[0], scores.device, self.window, cu_seqlens, attention_mask,
                                    q_slots)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        if self.dropout_p > 0 and self.training:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                probs = torch.nn.functional.dropout(probs, p=self.dropout_p)
        context = torch.matmul(probs, v)  # [b, np, sq, hn]
        return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_per_partition)


# --- flex_attention: bucketed widths, block masks per micro-batch -------------------------


@dataclass(frozen=True)
class PreparedBlockMask:
    """A micro-batch's flex block mask for one window variant, looked up before a compiled
    layer runs (`FlexSoftcapAttention.prepare_mask`) and handed down as the layer's
    attention mask: the lookup (keyed by tensor storage, outside any graph) cannot be
    traced, a BlockMask argument can, and a new one per micro-batch compiles nothing new."""

    block_mask: Any


FLEX_MIN_BUCKET = 128
FLEX_MAX_BUCKET = 2**17


def flex_bucket_width(width: int) -> int:
    """The sequence length flex_attention runs at for `width` real tokens: the next power
    of two, at least 128 (flex_attention's block size, so one block is the smallest unit
    it computes anyway).

    The kernel is compiled with static shapes, one compilation per width it sees; micro-
    batches are trimmed to their used columns, and evaluation and decoding without the KV
    cache (the width grows by one per step) use yet other widths. Powers of two keep the set
    small and known in advance — log2(max / 128) + 1 widths (7 up to 8192) — while the
    padding costs no attention work: the padded rows and columns are masked out, so the
    blocks beyond the real length are empty and the kernel skips them (only the copies
    of q, k, v into the wider tensors and the sliced output remain)."""
    if width < 1:
        raise ValueError(f"width must be >= 1 (got {width})")
    return max(FLEX_MIN_BUCKET, 1 << (width - 1).bit_length())


# How many compiled variants of flex_attention one process may need: every bucket up to
# FLEX_MAX_BUCKET (11) x window or not (2) x mask source: none / documents (cu_seqlens) /
# explicit attention_mask (3) x training or evaluation (grad mode and requires_grad are
# guarded, 2). A run uses one mask source, so it needs at most a third of this; the rest
# is headroom for other batch sizes (evaluation's last batch) and dtypes, which are
# compiled separately too (dynamic=False). Past dynamo's default of 8 the kernel would
# silently run uncompiled, materialising [b, heads, s, s] fp32 scores. It stays below
# dynamo's accumulated_recompile_limit (256), the cap on all entries of one code object.
FLEX_RECOMPILE_LIMIT = ((FLEX_MAX_BUCKET // FLEX_MIN_BUCKET).bit_length()) * 2 * 3 * 2


@functools.lru_cache(maxsize=None)
def compiled_flex_attention(backend: Any = "inductor"):
    """flex_attention under torch.compile(dynamic=False), one per process: dynamo keeps its
    compiled entries on flex_attention's code object, so all layers share them (a width
    compiled for layer 1 serves the other layers). The recompile limit is raised to
    FLEX_RECOMPILE_LIMIT for this region only where torch.compile takes `recompile_limit`
    (torch 2.14 does), else process-wide; a larger limit the user set is kept."""
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    dynamo_config = torch._dynamo.config
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    limit = max(FLEX_RECOMPILE_LIMIT, getattr(dynamo_config, name))
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        return torch.compile(flex_attention, dynamic=False, backend=backend, recompile_limit=limit)
    setattr(dynamo_config, name, limit)
    return torch.compile(flex_attention, dynamic=False, backend=backend)


def _flex_mask_mod(real_q: Tensor, real_k: Tensor, window: Optional[int], doc: Optional[Tensor],
                   allowed: Optional[Tensor], q_slot: Optional[Tensor]):
    """mask_mod of one micro-batch at bucket widths. `real_q`, `real_k` are the real query
    and key lengths as 0-dim tensors: a Python int would be a constant in the compiled
    kernel's guards and compile a new kernel per real length, defeating the buckets.
    `q_slot` maps a query row to its global slot under context parallelism (keys are then
    the whole row in global order); without it query row i is slot i."""

    def mask_mod(batch, head, q_idx, kv_idx):
        # Padded query rows see nothing and padded keys are seen by nobody: every block
        # beyond the real length is empty and skipped (flex_attention returns zeros for the
        # fully masked padded rows, which are sliced off).
        slot = q_idx if q_slot is None else q_slot[q_idx]
        keep = (q_idx < real_q) & (kv_idx < real_k) & (kv_idx <= slot)
        if window is not None:
            keep = keep & (slot - kv_idx < window)
        if doc is not None:
            keep = keep & (doc[slot] == doc[kv_idx])
        if allowed is not None:
            keep = keep & allowed[batch if allowed.shape[0] > 1 else 0, q_idx, kv_idx]
        return keep

    return mask_mod


def _softcap_score_mod(cap: float):
    def score_mod(score, batch, head, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap

    return score_mod


def _tensor_identity(t: Tensor) -> tuple:
    """Which part of its storage `t` is, and the storage's version (a buffer rewritten in
    place between micro-batches must not hit the previous micro-batch's block mask)."""
    version = None if t.is_inference() else t._version
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, version


# Block masks of the micro-batches alive now, keyed weakly by the storage of the tensor
# that defines their documents or mask (the explicit attention_mask, else cu_seqlens): the
# first layer of a micro-batch builds one per window variant, the other layers and the
# recomputation in the backward reuse it, and it goes away with the micro-batch. The
# storage, not the tensor: megatron's activation checkpointing hands the recomputed
# forward a detached copy (a new tensor object on the same storage).
_MICRO_BATCH_BLOCK_MASKS = WeakIdKeyDictionary()
# Block masks with causal + window only depend on (bucket, real length, window, device).
_PLAIN_BLOCK_MASKS: dict = {}
_PLAIN_BLOCK_MASKS_SIZE = 64


class FlexSoftcapAttention(CoreAttentionBase):
    """Gemma2 core attention on torch's flex_attention: the softcap is a `score_mod`
    (applied to the scaled score, before masking, as in HF) and causal + window +
    document + given masks form one `mask_mod`. q, k, v are padded to a bucket width
    (`flex_bucket_width`) so the compiled kernel sees a small known set of shapes.
    Compiled on GPU; the forward also runs eagerly on CPU (torch refuses its backward
    there)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        try:
            from torch.nn.attention import flex_attention as flex_module
        except ImportError as err:  # pragma: no cover - depends on the torch build
            raise ImportError("model.attention=flex needs torch.nn.attention.flex_attention (torch >= 2.5)") from err
        self._flex = flex_module
        self._score_mod = _softcap_score_mod(self.softcap) if self.softcap is not None else None

    def _attention_kernel(self, device: torch.device):
        # Inside a compiled layer flex_attention is part of that graph (compiled with it).
        if torch.compiler.is_compiling() or device.type != "cuda":
            return self._flex.flex_attention
        return compiled_flex_attention()

    def prepare_mask(self, attention_mask: Optional[Tensor], packed_seq_params: Optional[PackedSeqParams],
                     local_length: int, device: torch.device):
        """This layer's block mask of the micro-batch (`_block_mask`), made before a compiled
        layer's graph, for a layer whose input has `local_length` rows: its queries are
        those rows, all-gathered over the TP group under sequence parallelism (the QKV
        projection gathers them); under context parallelism they are this rank's chunks
        of the row, its keys the whole row (`_gather_row`), as `_attend` masks them."""
        if self.kv_cache is not None:
            return attention_mask
        sq = local_length * (self.config.tensor_model_parallel_size if self.config.sequence_parallel else 1)
        sk, q_slots, layout = sq, None, None
        if self.cp_group is not None:
            layout = (self.cp_group.size(), self.cp_group.rank())
            q_slots = _cp_layout(sq, *layout, device)[1]
            sk = sq * layout[0]
        return PreparedBlockMask(self._block_mask(sq, sk, flex_bucket_width(sq), flex_bucket_width(sk), device,
                                                  self._packed_boundaries(packed_seq_params), attention_mask,
                                                  q_slots, layout))

    def _attend(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                cu_seqlens: Optional[Tensor], q_slots: Optional[Tensor]) -> Tensor:
        sq, b, sk = query.shape[0], query.shape[1], key.shape[0]
        if q_slots is None and sk != sq:
            raise ValueError(f"training attention needs equal query ({sq}) and key ({sk}) lengths")
        width_q, width_k = flex_bucket_width(sq), flex_bucket_width(sk)
        if isinstance(attention_mask, PreparedBlockMask):
            block_mask = attention_mask.block_mask
        else:
            layout = None if q_slots is None else (self.cp_group.size(), self.cp_group.rank())
            block_mask = self._block_mask(sq, sk, width_q, width_k, query.device, cu_seqlens, attention_mask,
                                          q_slots, layout)
        # pad the sequence dimension of [s, b, heads, dim]
        query = torch.nn.functional.pad(query, (0, 0, 0, 0, 0, 0, 0, width_q - sq)) if width_q != sq else query
        if width_k != sk:
            key, value = (torch.nn.functional.pad(t, (0, 0, 0, 0, 0, 0, 0, width_k - sk)) for t in (key, value))
        out = self._attention_kernel(query.device)(
            query.permute(1, 2, 0, 3), key.permute(1, 2, 0, 3), value.permute(1, 2, 0, 3),
            score_mod=self._score_mod, block_mask=block_mask,
            scale=self.softmax_scale, enable_gqa=self.heads_per_partition != self.groups_per_partition,
        )
        return out[:, :, :sq].permute(2, 0, 1, 3).reshape(sq, b, self.hidden_per_partition)

    def _block_mask(self, sq: int, sk: int, width_q: int, width_k: int, device: torch.device,
                    cu_seqlens: Optional[Tensor], attention_mask: Optional[Tensor], q_slots: Optional[Tensor],
                    layout: Optional[tuple]):
        """This layer's block mask of the micro-batch, built by the first layer of its window
        variant and looked up by the others (see _MICRO_BATCH_BLOCK_MASKS). The tensors the
        mask_mod reads (real lengths, document ids, padded explicit mask, query slots) are
        made once per micro-batch and shared by both window variants. No host sync: all
        stays on the device. `layout` (CP size, rank) names the query slots in the keys."""
        defining = [t for t in (attention_mask, cu_seqlens) if t is not None]
        batch_key = (width_q, width_k, sq, sk, device, layout)
        if defining:
            # Keyed weakly by the first defining tensor's storage; a second one (documents
            # and a mask both given) is named by its storage's id, and the entry keeps that
            # storage alive so that the id cannot be reused while the entry exists.
            table = _MICRO_BATCH_BLOCK_MASKS.setdefault(defining[0].untyped_storage(), {})
            batch_key += tuple(_tensor_identity(t) for t in defining)
            batch_key += tuple(id(t.untyped_storage()) for t in defining[1:])
        else:
            table = _PLAIN_BLOCK_MASKS
        key = batch_key + (self.window,)
        block_mask = table.get(key)
        if block_mask is None:
            while table is _PLAIN_BLOCK_MASKS and len(table) >= _PLAIN_BLOCK_MASKS_SIZE:
                table.pop(next(iter(table)))  # the oldest
            inputs = table.get(batch_key)
            if inputs is None:
                inputs = table[batch_key] = _mask_inputs(sq, sk, width_q, width_k, device, cu_seqlens,
                                                         attention_mask, q_slots, defining[1:])
            real_q, real_k, doc, allowed, q_slot, _ = inputs
            # Compiled on CUDA: eagerly create_block_mask evaluates the mask_mod over the
            # whole [width_q, width_k] grid as dense tensors; compiled, it never materialises it.
            block_mask = table[key] = self._flex.create_block_mask(
                _flex_mask_mod(real_q, real_k, self.window, doc, allowed, q_slot),
                B=None if allowed is None or allowed.shape[0] == 1 else allowed.shape[0], H=None,
                Q_LEN=width_q, KV_LEN=width_k, device=device, _compile=device.type == "cuda",
            )
        return block_mask


def _mask_inputs(sq: int, sk: int, width_q: int, width_k: int, device: torch.device,
                 cu_seqlens: Optional[Tensor], attention_mask: Optional[Tensor], q_slots: Optional[Tensor],
                 keep_alive: list) -> tuple:
    """(real query and key lengths as 0-dim tensors, document id per key slot [width_k] or
    None, allowed [b|1, width_q, width_k] or None, global slot per query row [width_q] or
    None, storages the cache entry keeps alive) at bucket widths."""
    real_q = torch.full((), sq, device=device, dtype=torch.int64)  # fills, not host-to-device copies
    real_k = torch.full((), sk, device=device, dtype=torch.int64)
    doc = None if cu_seqlens is None else document_ids(cu_seqlens.to(device), width_k)
    allowed = None
    if attention_mask is not None:  # megatron's convention: True = masked out
        mask = attention_mask.to(device=device, dtype=torch.bool)
        allowed = ~mask.expand(mask.shape[0], 1, sq, sk)[:, 0]
        allowed = torch.nn.functional.pad(allowed, (0, width_k - sk, 0, width_q - sq), value=False)
    q_slot = None
    if q_slots is not None:  # padded query rows point at slot 0 (they are masked out anyway)
        q_slot = torch.nn.functional.pad(q_slots.to(device=device, dtype=torch.int64), (0, width_q - sq))
    return real_q, real_k, doc, allowed, q_slot, [t.untyped_storage() for t in keep_alive]
