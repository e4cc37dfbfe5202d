"""What cannot run on fake tensors in a CPU process, and what stands in for it.

Each stand-in keeps the memory profile of what it replaces, the tensors it saves for
the backward and the tensors it returns, and computes nothing (fake tensors have no
values). `install(backend)` puts them in place and returns one line per stand-in, which
the probe prints.
"""

from __future__ import annotations

import contextlib

import torch

from orchestrator.models.norms import rms_norm, zero_centered_rms_norm  # before install() replaces them


# The two kernels are custom operators, each with its backward operator, rather than
# autograd Functions: inside a compiled layer (the probe compiles the layers the job
# compiles, orchestrator/probe/compiled.py) the compiler's partitioner then sees what
# each backward reads, as it sees the real kernels', and keeps those tensors; an
# autograd Function that only reads shapes would let it keep nothing. Each operator's
# outputs are empty tensors of the kernel's shapes, real or fake alike.
def _stand_in_op(name: str, outputs):
    op = torch.library.custom_op(f"audiollm_probe::{name}", outputs, mutates_args=())
    op.register_fake(outputs)
    return op


def _flex_outputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's flex_attention, compiled (a Triton kernel on CUDA): the output and the fp32
    log-sum-exp [b, heads, s_q]; its backward reads q, k, v, both and the output's gradient."""
    return torch.empty_like(query), torch.empty(query.shape[:-1], dtype=torch.float32, device=query.device)


def _flex_grads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _norm_outputs(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused RMSNorm, zero-centred or not (TransformerEngine's, or the local backend's
    compiled one): x's dtype and the fp32 reciprocal RMS [.., 1]; its backward reads x, the
    weight and that."""
    return torch.empty_like(x), torch.empty(x.shape[:-1] + (1,), dtype=torch.float32, device=x.device)


def _norm_grads(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(weight)


_flex_attention = _stand_in_op("flex_attention", _flex_outputs)
_flex_attention_backward = _stand_in_op("flex_attention_backward", _flex_grads)
_flex_attention.register_autograd(
    lambda ctx, grad_out, grad_lse: _flex_attention_backward(*ctx.saved_tensors, grad_out),
    setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs, *output))
_fused_rms_norm = _stand_in_op("fused_rms_norm", _norm_outputs)
_fused_rms_norm_backward = _stand_in_op("fused_rms_norm_backward", _norm_grads)


def _norm_grad(ctx, grad_out, grad_rstd):
    grad_x, grad_weight = _fused_rms_norm_backward(*ctx.saved_tensors, grad_out)
    return grad_x, grad_weight if ctx.needs_input_grad[1] else None


_fused_rms_norm.register_autograd(
    _norm_grad, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0], inputs[1], output[1]))


def flex_attention_stand_in(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False):
    return _flex_attention(query, key, value)[0]


def fused_rms_norm_stand_in(arithmetic):
    """The stand-in for one of orchestrator.models.norms' functions, `arithmetic`."""

    def stand_in(x, weight, eps):
        if torch.compiler.is_compiling():  # inside a compiled layer: the norm's own arithmetic, as the job compiles it
            return arithmetic(x, weight, eps)
        return _fused_rms_norm(x, weight)[0]

    return stand_in


def install(backend: str) -> list[str]:
    """Put the stand-ins in place for a model built for a GPU with `backend`; returns what
    stands in for what."""
    from orchestrator.models import attention, decoder_spec, norms

    lines = []
    attention.FlexSoftcapAttention._attention_kernel = lambda self, device: flex_attention_stand_in
    attention.FlexSoftcapAttention._block_mask = lambda self, *args, **kwargs: None
    lines.append("attention flex: a stand-in saving q, k, v, output and fp32 log-sum-exp (the compiled kernel's "
                 "profile; its block mask, about s^2/128^2 int32, is not counted)")
    # Both norms (Gemma's zero-centred one, the other families' x*w): on a GPU each runs fused.
    norms.zero_centered_rms_norm = fused_rms_norm_stand_in(zero_centered_rms_norm)
    norms.rms_norm = fused_rms_norm_stand_in(rms_norm)
    lines.append("RMSNorm: a fused stand-in saving its input and the fp32 reciprocal RMS (compiled or "
                 "TransformerEngine's kernel; inside a compiled layer, the norm's own arithmetic)")
    if backend == "te":
        local = decoder_spec._modules("local")
        decoder_spec._modules = lambda name: local
        lines.append("TransformerEngine linears: megatron's own tensor-parallel linears (the same saved inputs)")
    return lines


class _CTCLoss(torch.autograd.Function):
    """torch's CTC loss: saves the log-probabilities [T, clips, classes] and the fp32
    forward variables [clips, T, 2 x target length + 1]; returns one loss per clip."""

    @staticmethod
    def forward(ctx, log_probs, longest_target: int):
        frames, clips = log_probs.shape[0], log_probs.shape[1]
        alpha = torch.empty(clips, frames, 2 * longest_target + 1, dtype=torch.float32, device=log_probs.device)
        ctx.save_for_backward(log_probs, alpha)
        return torch.empty(clips, dtype=log_probs.dtype, device=log_probs.device)

    @staticmethod
    def backward(ctx, grad):
        log_probs, _ = ctx.saved_tensors
        return torch.empty_like(log_probs), None


def ctc_loss_stand_in(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
                      zero_infinity=False):
    """The shape of torch's CTC loss's result depends on the targets' lengths (values): the
    stand-in takes the longest as the mean length, targets / clips."""
    longest = -(-targets.numel() // max(1, log_probs.shape[1]))
    return _CTCLoss.apply(log_probs, longest)


def _apply_rebuilding_parameters(self, fn, recurse=True):
    """nn.Module._apply (dtype and device casts) for fake parameters: fake tensors carry the
    fake mode's weak references, so torch's in-place swap of each parameter refuses them;
    this makes a new Parameter of the cast tensor (with the old one's attributes, such as
    megatron's `tensor_model_parallel`) -- at build time nothing holds the old one yet."""
    if recurse:
        for child in self.children():
            child._apply(fn)
    for key, param in self._parameters.items():
        if param is not None:
            with torch.no_grad():
                cast = torch.nn.Parameter(fn(param), param.requires_grad)
            cast.__dict__.update(param.__dict__)
            self._parameters[key] = cast
    for key, buffer in self._buffers.items():
        if buffer is not None:
            self._buffers[key] = fn(buffer)
    return self


def fake_tensor_limits() -> list[str]:
    """Stand-ins for what fake tensors cannot do whatever the machine planned."""
    torch.nn.Module._apply = _apply_rebuilding_parameters
    torch.nn.functional.ctc_loss = ctc_loss_stand_in
    return ["module dtype casts: new parameters instead of in-place swaps (fake tensors refuse the swap)",
            "CTC loss: a stand-in saving the log-probabilities and fp32 forward variables (its output shape "
            "depends on values)"]


def skip_value_reads() -> list[str]:
    """What reads tensor values on the step's way, which fake tensors do not have,
    replaced; returns what was replaced."""
    import megatron.core.optimizer.optimizer as megatron_optimizer
    from megatron.core.tensor_parallel import random as megatron_random

    # megatron's RNG tracker compares the CPU generator's state before and after a fork
    # (`.item()` on the comparison). Nothing in a fake step draws numbers that matter.
    @contextlib.contextmanager
    def fork(self, name="model-parallel-rng"):
        yield

    megatron_random.CudaRNGStatesTracker.fork = fork
    # The gradient norm (for clipping and the log) sums per-tensor norms read as values; it
    # allocates one scalar per parameter tensor.
    megatron_optimizer.get_grad_norm_fp32 = lambda *args, **kwargs: 0.0
    return ["megatron's RNG-tracker fork: no state check", "gradient norm: 0 (not computed)"]
