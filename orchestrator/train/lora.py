"""LoRA on megatron-core's tensor-parallel linears (megatron's own or TransformerEngine's),
sharded like the layer it adapts.

y = W x + (alpha / rank) * B (A x), with A [rank, in] and B [out, rank].

- Column-parallel (linear_qkv, linear_fc1; output split over TP): A is replicated,
  B is split on its output dim like W. A's output goes through
  copy_to_tensor_model_parallel_region so that the gradient of A x is summed over the
  TP ranks (each rank's B shard contributes a part).
- Row-parallel (linear_proj, linear_fc2; input split over TP): A is split on its
  input dim like W, B is replicated. A x is all-reduced over TP before B.
- Gated fc1 (GLU, output [gate; up]): TP rank r holds [gate_r; up_r] of W, so B is
  split the same way and checkpointed with megatron's swiglu factory, as W is.
- Sequence parallel: the column case applies A to the local sequence shard and
  all-gathers the rank-wide result; the row case reduce-scatters A x to sequence
  shards. The replicated factor then sees only its shard's gradient, so it is marked
  `sequence_parallel` and finalize_model_grads sums it over TP (like norms).

The adapters are submodules `lora_a` / `lora_b` of the adapted linear itself, so
parameter names are `<linear>.lora_a.weight` / `<linear>.lora_b.weight` and the base
weight keeps its name `<linear>.weight`. The linear's class is swapped for a subclass
that adds the LoRA path to forward and to sharded_state_dict. Base weights (and
biases) of adapted linears are frozen. merge_lora folds B A into W and removes the
adapters (export).

Initial values are drawn for the FULL (unsharded) factors from a generator seeded by
(seed, parameter name) and then sliced, so any TP size starts from the same adapter.
"""

from __future__ import annotations

import fnmatch
import math
import zlib
from typing import Iterable

import torch

DECODER_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")

_lora_classes: dict = {}


def _tp_rank_size(layer):
    # megatron's linears keep their group in `tp_group`; its TransformerEngine wrappers in
    # `_tp_group` (TE's own `tp_group` is None when TE does no communication).
    group = getattr(layer, "tp_group", None)
    if group is None:
        group = getattr(layer, "_tp_group", None)
    if group is None:
        from megatron.core import parallel_state

        group = parallel_state.get_tensor_model_parallel_group()
    return torch.distributed.get_rank(group), torch.distributed.get_world_size(group), group


def _is_column(layer) -> bool:
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    if isinstance(layer, ColumnParallelLinear):
        return True
    if isinstance(layer, RowParallelLinear):
        return False
    # TransformerEngine linears (the `te` backend: megatron's TEColumnParallelLinear and
    # TERowParallelLinear subclass te.pytorch.Linear, not megatron's classes) record their
    # split in `parallel_mode`; their forward returns (output, bias) like megatron's.
    mode = getattr(layer, "parallel_mode", None)
    if mode in ("column", "row"):
        return mode == "column"
    raise TypeError(
        f"LoRA adapts tensor-parallel linears (megatron Column/RowParallelLinear, TransformerEngine linears "
        f"with parallel_mode 'column' or 'row') and torch.nn.Linear; {type(layer).__name__} is none of them "
        f"(parallel_mode {mode!r}): remove it from lora.targets")


class _LoraMixin:
    """Forward and checkpoint layout of an adapted megatron parallel linear."""

    def _lora_delta(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel import mappings

        group = self._lora_tp_group
        a = self.lora_a.weight
        b = self.lora_b.weight
        x = self.lora_dropout(x)
        if self._lora_column:
            h = torch.nn.functional.linear(x, a.to(x.dtype))
            if self.sequence_parallel:
                h = mappings.gather_from_sequence_parallel_region(h, group=group)
            else:
                h = mappings.copy_to_tensor_model_parallel_region(h, group=group)
            return torch.nn.functional.linear(h, b.to(x.dtype)) * self.lora_scaling
        h = torch.nn.functional.linear(x, a.to(x.dtype))
        if self.sequence_parallel:
            h = mappings.reduce_scatter_to_sequence_parallel_region(h, group=group)
        else:
            h = mappings.reduce_from_tensor_model_parallel_region(h, group=group)
        return torch.nn.functional.linear(h, b.to(x.dtype)) * self.lora_scaling

    def forward(self, input_, *args, **kwargs):
        output, bias = super().forward(input_, *args, **kwargs)
        if self.lora_enabled:
            output = output + self._lora_delta(input_).to(output.dtype)
        return output, bias

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        state_dict = self.state_dict(prefix="", keep_vars=True)
        if self._lora_column:
            axes = {"weight": 0, "bias": 0, "lora_b.weight": 0}
        else:
            axes = {"weight": 1, "lora_a.weight": 1}
        sharded = make_sharded_tensors_for_checkpoint(
            state_dict, prefix, axes, sharded_offsets, tp_group=self._lora_tp_group,
            dp_cp_group=(metadata or {}).get("dp_cp_group"),
        )
        if self._lora_glu:
            # Like megatron's MLP does for fc1's weight: each rank holds [gate_r; up_r],
            # so B is saved as two separately sharded halves (reshardable over TP).
            from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

            key = f"{prefix}lora_b.weight"
            sharded[key] = apply_swiglu_sharded_factory(
                sharded[key], sharded_offsets, (metadata or {}).get("singleton_local_shards", False))
        return sharded


class _LoraPlainLinearMixin:
    """LoRA on a plain torch.nn.Linear (encoder and adapter linears, replicated over TP)."""

    def forward(self, input_):
        output = super().forward(input_)
        if self.lora_enabled:
            x = self.lora_dropout(input_)
            output = output + torch.nn.functional.linear(
                torch.nn.functional.linear(x, self.lora_a.weight.to(x.dtype)), self.lora_b.weight.to(x.dtype)
            ) * self.lora_scaling
        return output


def _plain_class(cls):
    if cls not in _lora_classes:
        _lora_classes[cls] = type("Lora" + cls.__name__, (_LoraPlainLinearMixin, cls), {})
    return _lora_classes[cls]


def _add_plain_lora(layer, name, rank, alpha, dropout, seed, b_std):
    out_features, in_features = layer.weight.shape
    a = _seeded_full((rank, in_features), seed, name + ".lora_a", 1.0 / math.sqrt(in_features))
    b = _seeded_full((out_features, rank), seed, name + ".lora_b", b_std) if b_std else torch.zeros(out_features, rank)
    dtype, device = layer.weight.dtype, layer.weight.device
    layer.lora_a = torch.nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
    layer.lora_b = torch.nn.Linear(rank, out_features, bias=False, device=device, dtype=dtype)
    with torch.no_grad():
        layer.lora_a.weight.copy_(a)
        layer.lora_b.weight.copy_(b)
    layer.lora_dropout = torch.nn.Dropout(dropout) if dropout else torch.nn.Identity()
    layer.lora_scaling = alpha / rank
    layer.lora_enabled = True
    for param in (layer.weight, layer.bias):
        if param is not None:
            param.requires_grad_(False)
    layer.__class__ = _plain_class(type(layer))


def _lora_class(cls):
    if cls not in _lora_classes:
        _lora_classes[cls] = type("Lora" + cls.__name__, (_LoraMixin, cls), {})
    return _lora_classes[cls]


def _seeded_full(shape, seed: int, name: str, std: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 7919 + zlib.crc32(name.encode()))
    return torch.randn(*shape, generator=gen) * std


def add_lora(layer, name: str, rank: int, alpha: float, dropout: float, seed: int, b_std: float = 0.0) -> None:
    """Adapt one megatron parallel linear in place. `name` is its full module name
    (it seeds the initial values). B starts at zero (b_std 0): the adapted model
    starts equal to the base model."""
    if isinstance(layer, torch.nn.Linear):
        _add_plain_lora(layer, name, rank, alpha, dropout, seed, b_std)
        return
    column = _is_column(layer)
    tp_rank, tp_size, group = _tp_rank_size(layer)
    weight = layer.weight
    out_local, in_local = weight.shape
    out_full = out_local * tp_size if column else out_local
    in_full = in_local if column else in_local * tp_size
    # Kaiming-uniform-like scale for A (as the reference LoRA), B zero.
    a_full = _seeded_full((rank, in_full), seed, name + ".lora_a", 1.0 / math.sqrt(in_full))
    b_full = _seeded_full((out_full, rank), seed, name + ".lora_b", b_std) if b_std else torch.zeros(out_full, rank)
    # A gated fc1 (GLU: output [gate; up]) holds [gate_r; up_r] on TP rank r.
    glu = column and name.endswith("linear_fc1") and bool(getattr(getattr(layer, "config", None), "gated_linear_unit", False))
    if glu:
        gate, up = b_full.chunk(2, dim=0)
        a_local, b_local = a_full, torch.cat([gate.chunk(tp_size, 0)[tp_rank], up.chunk(tp_size, 0)[tp_rank]])
    elif column:
        a_local, b_local = a_full, b_full.chunk(tp_size, dim=0)[tp_rank]
    else:
        a_local, b_local = a_full.chunk(tp_size, dim=1)[tp_rank], b_full
    dtype, device = weight.dtype, weight.device
    layer.lora_a = torch.nn.Linear(a_local.shape[1], rank, bias=False, device=device, dtype=dtype)
    layer.lora_b = torch.nn.Linear(rank, b_local.shape[0], bias=False, device=device, dtype=dtype)
    with torch.no_grad():
        layer.lora_a.weight.copy_(a_local)
        layer.lora_b.weight.copy_(b_local)
    replicated = layer.lora_a.weight if column else layer.lora_b.weight
    sharded = layer.lora_b.weight if column else layer.lora_a.weight
    # megatron's TP bookkeeping: the split factor is a tensor-parallel param (grad norm
    # counts every shard); the replicated one is counted once.
    sharded.tensor_model_parallel = True
    sharded.partition_dim = 0 if column else 1
    sharded.partition_stride = 1
    replicated.tensor_model_parallel = False
    if getattr(layer, "sequence_parallel", False):
        replicated.sequence_parallel = True
    layer.lora_dropout = torch.nn.Dropout(dropout) if dropout else torch.nn.Identity()
    layer.lora_scaling = alpha / rank
    layer.lora_enabled = True
    layer._lora_column = column
    layer._lora_glu = glu
    layer._lora_tp_group = group
    for param_name in ("weight", "bias"):
        param = getattr(layer, param_name, None)
        if isinstance(param, torch.nn.Parameter):
            param.requires_grad_(False)
    layer.__class__ = _lora_class(type(layer))


def lora_target_names(model: torch.nn.Module, targets: Iterable[str], extra_patterns: Iterable[str] = ()) -> list:
    """Module names to adapt: decoder linears whose last name component is in
    `targets`, plus modules matching `extra_patterns` (fnmatch on the full name)."""
    targets = set(targets)
    names = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in targets or any(fnmatch.fnmatchcase(name, p) for p in extra_patterns):
            names.append(name)
    return names


# HF WhisperEncoder's attention and MLP linears; the adapter's linears, of every kind
# (orchestrator/plan/adapter_kinds.py linear_shapes).
ENCODER_PATTERNS = ("encoder.layers.*.self_attn.q_proj", "encoder.layers.*.self_attn.k_proj",
                    "encoder.layers.*.self_attn.v_proj", "encoder.layers.*.self_attn.out_proj",
                    "encoder.layers.*.fc1", "encoder.layers.*.fc2")
ADAPTER_PATTERNS = ("adapter.linear", "adapter.linear_1", "adapter.linear_2")


def apply_lora(model: torch.nn.Module, lora_cfg: dict, seed: int, b_std: float = 0.0,
               extra_patterns: Iterable[str] = ()) -> list:
    """Adapt every target linear of `model` (a no-op when lora.rank is 0): decoder
    linears named in lora.targets, plus the encoder's (lora.encoder) and the
    adapter's (lora.adapter) linears. Returns the adapted module names."""
    rank = int(lora_cfg.get("rank", 0))
    if rank <= 0:
        return []
    targets = lora_cfg.get("targets")
    targets = DECODER_TARGETS if targets is None else targets  # [] adapts no decoder linear
    extra_patterns = list(extra_patterns)
    if lora_cfg.get("encoder"):
        extra_patterns += ENCODER_PATTERNS
    if lora_cfg.get("adapter"):
        extra_patterns += ADAPTER_PATTERNS
    names = lora_target_names(model, targets, extra_patterns)
    if not names:
        raise ValueError(
            f"lora.rank is {rank} but nothing to adapt: lora.targets {list(targets)}, lora.encoder "
            f"{bool(lora_cfg.get('encoder'))}, lora.adapter {bool(lora_cfg.get('adapter'))} match no module of the "
            f"model; name megatron linears ({', '.join(DECODER_TARGETS)}) or set lora.rank 0")
    modules = dict(model.named_modules())
    for name in names:
        add_lora(modules[name], name, rank, float(lora_cfg.get("alpha", rank)), float(lora_cfg.get("dropout", 0.0)),
                 seed, b_std=b_std)
    return names


@torch.no_grad()
def merge_lora(model: torch.nn.Module) -> int:
    """Fold every adapter into its base weight (W += scaling * B A on this rank's
    shard) and remove it, restoring the plain megatron class. Returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, (_LoraMixin, _LoraPlainLinearMixin)):
            a = module.lora_a.weight.float()
            b = module.lora_b.weight.float()
            delta = (b @ a) * module.lora_scaling
            module.weight.copy_((module.weight.float() + delta).to(module.weight.dtype))
            base_cls = type(module).__mro__[2]
            del module.lora_a, module.lora_b, module.lora_dropout
            module.__class__ = base_cls
            count += 1
    return count


def lora_parameter_names(model: torch.nn.Module) -> list:
    return [n for n, _ in model.named_parameters() if ".lora_a." in n or ".lora_b." in n]
