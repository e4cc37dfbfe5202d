"""RMSNorms with megatron's norm constructor signature: Gemma's zero-centred one and
Llama's plain one (orchestrator/plan/decoder_families.py says which family takes which)."""

from __future__ import annotations

import functools

import torch
from torch import nn


class ZeroCenteredRMSNorm(nn.Module):
    """`x * rsqrt(mean(x^2) + eps) * (1 + w)`, computed in fp32, cast back to x's dtype.

    The stored weight is the offset from one (HF Gemma2 stores it the same way), so a
    fresh norm (w = 0) is the identity scale. With sequence parallelism the norm sees
    only a slice of the sequence, so its gradient is partial on each TP rank: the
    weight is tagged `sequence_parallel` for megatron's `finalize_model_grads` to sum
    it over the tensor-parallel group.
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(
            torch.zeros(hidden_size, dtype=config.params_dtype, device=_init_device(config))
        )
        setattr(self.weight, "sequence_parallel", bool(config.sequence_parallel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Inside a compiled layer (model.compile=layers) the norm is part of that graph.
        fused = x.is_cuda and not torch.compiler.is_compiling()
        norm = compiled_zero_centered_rms_norm() if fused else zero_centered_rms_norm
        return norm(x, self.weight, self.eps)


class RMSNorm(nn.Module):
    """Llama's `w * cast(x * rsqrt(mean(x^2) + eps))`: normalised in fp32, cast back to
    x's dtype, then scaled (HF LlamaRMSNorm's order; the weight starts at one). Tagged
    `sequence_parallel` as ZeroCenteredRMSNorm is: megatron's own torch norm refuses
    sequence parallelism."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype, device=_init_device(config)))
        setattr(self.weight, "sequence_parallel", bool(config.sequence_parallel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = x.is_cuda and not torch.compiler.is_compiling()
        norm = compiled_rms_norm() if fused else rms_norm
        return norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x)


@functools.lru_cache(maxsize=None)
def compiled_rms_norm():
    """Llama's norm as one fused kernel on CUDA (as compiled_zero_centered_rms_norm)."""
    return torch.compile(rms_norm, dynamic=True)


def zero_centered_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).type_as(x)


@functools.lru_cache(maxsize=None)
def compiled_zero_centered_rms_norm():
    """The norm as one fused kernel on CUDA (the local backend's answer to TransformerEngine's
    fused RMSNorm): eagerly it is seven kernels with fp32 copies of x in between, at bf16
    [s, b, h] four times a layer. Dynamic shapes: every micro-batch width uses one kernel."""
    return torch.compile(zero_centered_rms_norm, dynamic=True)


def _init_device(config) -> str:
    if config.use_cpu_initialization or not torch.cuda.is_available():
        return "cpu"
    return f"cuda:{torch.cuda.current_device()}"
