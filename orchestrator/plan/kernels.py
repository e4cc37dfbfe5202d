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


def _on_machine(key: str, choice: str, choices: tuple, on_gpu: bool, gpu: str, cpu: str) -> str:
    """`key`'s `choice`, one of `choices`: as it is, or for "auto" `gpu` on a GPU and `cpu`
    on a CPU."""
    if choice not in choices:
        raise ValueError(f"{key}={choice!r} is not one of {choices}")
    if choice == "auto":
        return gpu if on_gpu else cpu
    return choice


def attention_kernel(choice: str, on_gpu: bool) -> str:
    """`model.attention` -> "reference" or "flex" on a GPU (on_gpu) or CPU machine."""
    return _on_machine("model.attention", choice, ATTENTION_CHOICES, on_gpu, gpu="flex", cpu="reference")


ENCODER_PRECISIONS = ("auto", "fp32", "bf16")


def encoder_precision(choice: str, on_gpu: bool) -> str:
    """`model.encoder.precision` -> "fp32" (HF's eager attention: the reference) or "bf16"
    (bf16 weights, PyTorch's scaled_dot_product_attention). auto: bf16 on a GPU (a frozen
    whisper-large-v3 is about 2.3 TFLOP per 30-s clip, ~5 clips per 2048-token row: fp32
    eager would weigh on every step; a trained encoder's fp32 master weights live in
    megatron's bf16 optimizer, which holds and checkpoints only parameters of the compute
    dtype), fp32 on a CPU (no bf16 speed-up there)."""
    return _on_machine("model.encoder.precision", choice, ENCODER_PRECISIONS, on_gpu, gpu="bf16", cpu="fp32")


# `model.compile`: none (eager), layers (every decoder and encoder layer compiled whole,
# fullgraph, and the softcapped loss: orchestrator/models/compile.py) or auto (the default:
# layers on a GPU where the layout allows it, none elsewhere).
COMPILE_CHOICES = ("auto", "none", "layers")


def compile_blockers(backend: str, recompute_granularity) -> list:
    """Why the compiled layer cannot take this layout: [(setting, reason, fix)], empty if it
    can. Any TP, CP, SP, PP and DP can: the layers' collectives are traced into their graphs
    (orchestrator/models/compile.py)."""
    blockers = []
    if backend != "local":
        blockers.append((f"model.backend={backend}", "TransformerEngine's fused modules, where model.compile=layers "
                                                     "compiles megatron-core's own linears and the project's norms",
                         "model.backend=local"))
    if recompute_granularity == "selective":
        blockers.append(("parallel.recompute.granularity=selective",
                         "megatron recomputes the core attention inside the layer with a checkpoint that takes "
                         "tensors only, and the compiled layer hands it the prepared block mask",
                         "parallel.recompute.granularity=full (or null)"))
    return blockers


def loss_compiles(tp: int) -> bool:
    """Whether compiled layers (model.compile=layers) fuse the softcapped loss too: at TP 1
    only; under TP each rank holds a slice of the vocabulary and megatron's vocab-parallel
    cross entropy (its maximum and sums all-reduced) stays eager."""
    return tp == 1


def compile_kind(choice: str, on_gpu: bool, backend: str, recompute_granularity) -> tuple:
    """`model.compile` on a GPU (on_gpu) or CPU machine -> ("none" | "layers", why). auto
    compiles on GPUs, where the step is bound by the host's launches (an H200 at
    gemma2-2b: 1.43x the eager tokens/s, docs/gpu-machines.md), not on CPUs, whose steps
    are bound by the arithmetic and where tests and the default run would pay the
    compilation and the CPU path keeps its exact eager arithmetic."""
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"model.compile={choice!r} is not one of {COMPILE_CHOICES}")
    if choice != "auto":
        return choice, f"model.compile={choice}"
    if not on_gpu:
        return "none", "model.compile=auto, CPU"
    blockers = compile_blockers(backend, recompute_granularity)
    if blockers:
        return "none", f"model.compile=auto, not with {blockers[0][0]}"
    return "layers", "model.compile=auto, CUDA"


def planned_compile(cfg) -> str:
    """compile_kind's choice ("none" | "layers") for a planned run (AudioLLMConfig) on its
    planned accelerator: what the plan reports and its memory estimate counts."""
    return compile_kind(cfg.model.compile, cfg.launcher.accelerator == "gpu", cfg.model.backend,
                        cfg.parallel.recompute.granularity)[0]


# Logits per chunk of the final softcap + cross entropy (DecoderModel.softcapped_loss):
# 2^27 fp32 values, 512 MiB per fp32 copy.
LOSS_CHUNK_ELEMENTS = 2**27
# fp32 tensors of one chunk alive at the peak of its recomputed backward: the capped
# logits, megatron's vocab-parallel cross entropy's softmax (computed in place of its
# input) and the gradient (measured by the full-size probe, orchestrator/probe/).
LOSS_CHUNK_FP32_COPIES = 3
