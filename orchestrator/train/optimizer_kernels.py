"""The gradient norm, clipping and main-to-model weight copies of megatron's optimizer,
with torch's multi-tensor (foreach) kernels where neither TransformerEngine nor apex is
installed.

Without them megatron-core falls back to per-tensor Python loops
(megatron/core/utils.py `local_multi_tensor_l2_norm`, `local_multi_tensor_scale`): the
gradient norm takes one norm kernel per trainable tensor and then builds a host tensor
from the norms, which reads every one of them back from the GPU, a host sync per tensor,
each waiting for the backward's queue to drain; the clipping and the fp32 -> bf16 copies
after the step take two kernels per tensor. That is part of the optimizer's ~40 ms of a
gemma2-2b step on one H200 (docs/gpu-machines.md). torch's foreach kernels do the same
arithmetic over the whole list in a few launches and keep the norm on the device, so
megatron's clipping reads it once (its `total_norm.item()`, which it needs for the clip
coefficient). With TransformerEngine or apex present megatron's own fused kernels stay.

The Adam step itself, without them, is torch.optim.AdamW (megatron-core 0.16.1
optimizer/__init__.py), whose implementation torch picks at each step: foreach when every
parameter is a CUDA tensor, a per-tensor loop on CPUs; `describe` says which, in the
job's first lines. torch's fused AdamW is not chosen: the step it would shorten is a
few dozen launches of a LoRA run's few hundred small tensors (under a millisecond of a
step of seconds), and a full fine-tune's foreach step is bound by memory either way.
"""

from __future__ import annotations

import torch


def foreach_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """Drop-in for amp_C.multi_tensor_l2norm as megatron calls it: the l2 norm of all the
    tensors of tensor_lists[0] together, as a 1-element fp32 tensor on their device."""
    tensors = tensor_lists[0]
    norms = torch._foreach_norm(tensors)
    total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))
    return total.reshape(1), None


def foreach_scale(chunk_size, noop_flag, tensor_lists, scale):
    """Drop-in for amp_C.multi_tensor_scale: tensor_lists[1][i] = tensor_lists[0][i] * scale
    (in the destination's dtype: megatron copies fp32 main weights into bf16 ones so)."""
    src, dst = tensor_lists
    if all(s is d for s, d in zip(src, dst)):
        torch._foreach_mul_(dst, scale)
        return
    torch._foreach_copy_(dst, torch._foreach_mul(src, scale) if scale != 1.0 else src)


def describe(optimizer) -> str:
    """One line: the class and implementation of the Adam step megatron's `optimizer`
    runs (per torch optimizer it chains), and which kernels take its gradient norm,
    clipping and weight copies (as megatron's modules hold them now)."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads
    from torch.optim.optimizer import _default_to_fused_or_foreach

    steps = []
    for wrapped in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(wrapped, "optimizer", None)
        if inner is None:  # a rank with nothing to train in this chain
            continue
        kind = type(inner)
        name = f"{kind.__module__}.{kind.__qualname__}"
        if kind.__module__.startswith("torch.optim"):
            group = inner.param_groups[0]
            if group.get("fused"):
                how = "fused"
            elif group.get("foreach") is None:  # torch decides at each step, from the parameters
                params = [p for g in inner.param_groups for p in g["params"]]
                how = "foreach" if _default_to_fused_or_foreach(params, False)[1] else "per-tensor loop"
            else:
                how = "foreach" if group["foreach"] else "per-tensor loop"
            name += f" ({how})"
        if name not in steps:
            steps.append(name)
    helpers = {foreach_l2_norm: "torch's foreach kernels (no TransformerEngine or apex)",
               utils.local_multi_tensor_l2_norm: "megatron's per-tensor loops"}.get(
        clip_grads.l2_norm_impl, "TransformerEngine's or apex's multi-tensor kernels")
    return f"optimizer: {', '.join(steps) or 'nothing to train'}; gradient norm, clipping, weight copies: {helpers}"


def install() -> bool:
    """Use the foreach kernels in megatron's optimizer where it fell back to its per-tensor
    loops; True when it did. Call before the first optimizer step."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    installed = False
    if clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = foreach_l2_norm
        installed = True
    if clip_grads.multi_tensor_scale_impl is utils.local_multi_tensor_scale:
        clip_grads.multi_tensor_scale_impl = foreach_scale
        installed = True
    if getattr(optimizer, "multi_tensor_scale_impl", None) is utils.local_multi_tensor_scale:
        optimizer.multi_tensor_scale_impl = foreach_scale
        installed = True
    return installed
