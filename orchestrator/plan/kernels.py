"""Which kernels and precisions a run uses: one rule for the plan (submit side, no
torch) and the job, so that the plan's memory estimate describes what the job builds.

`model.attention` is independent of `model.backend` (which picks the linears and norms:
megatron's own or TransformerEngine's):
- reference: plain PyTorch (orchestrator.models.attention.SoftcapDotProductAttention).
  Runs everywhere and is the numerical reference of the parity tests; it keeps fp32
  [b, heads, s, s] scores for the backward (slow at 2k tokens, out of memory at 8k).
- flex: torch's flex_attention (FlexSoftcapAttention), compiled on CUDA; no s x s tensor.
  torch refuses its backward on CPU, so CPU training cannot use it.
- auto (the default): flex on a GPU, reference on a CPU.
"""

from __future__ import annotations

ATTENTION_CHOICES = ("auto", "reference", "flex")


def attention_kernel(choice: str, on_gpu: bool) -> str:
    """`model.attention` -> "reference" or "flex" on a GPU (on_gpu) or CPU machine."""
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"model.attention={choice!r} is not one of {ATTENTION_CHOICES}")
    if choice == "auto":
        return "flex" if on_gpu else "reference"
    return choice


ENCODER_PRECISIONS = ("auto", "fp32", "bf16")


def encoder_precision(choice: str, on_gpu: bool) -> str:
    """`model.encoder.precision` -> "fp32" (HF's eager attention: the reference) or "bf16"
    (bf16 weights, PyTorch's scaled_dot_product_attention). auto: bf16 on a GPU (a frozen
    whisper-large-v3 is about 2.3 TFLOP per 30-s clip, ~5 clips per 2048-token row: fp32
    eager would weigh on every step; a trained encoder's fp32 master weights live in
    megatron's bf16 optimizer, which holds and checkpoints only parameters of the compute
    dtype), fp32 on a CPU (no bf16 speed-up there)."""
    if choice not in ENCODER_PRECISIONS:
        raise ValueError(f"model.encoder.precision={choice!r} is not one of {ENCODER_PRECISIONS}")
    if choice == "auto":
        return "bf16" if on_gpu else "fp32"
    return choice


# `model.compile`: none (eager) or layers (every decoder layer compiled whole, fullgraph:
# orchestrator/models/compile.py). A choice, not decided from the machine yet: its gain on a
# GPU is measured by benchmarks/gpu_acceptance.py before it becomes a default.
COMPILE_CHOICES = ("none", "layers")


# Logits per chunk of the final softcap + cross entropy (Gemma2Model.softcapped_loss):
# 2^27 fp32 values, 512 MiB per fp32 copy.
LOSS_CHUNK_ELEMENTS = 2**27
# fp32 tensors of one chunk alive at the peak of its recomputed backward: the capped
# logits, megatron's vocab-parallel cross entropy's softmax (computed in place of its
# input) and the gradient (measured by the full-size probe, orchestrator/probe/).
LOSS_CHUNK_FP32_COPIES = 3
