"""Which attention kernel a run uses: one rule for the plan (submit side, no torch) and
the job, so that the plan's memory estimate describes what the job builds.

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
