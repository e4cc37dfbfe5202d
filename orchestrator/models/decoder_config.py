"""The decoder's megatron-core TransformerConfig, built one way.

`build_transformer_config(fields, dims, params_dtype)` turns a model's megatron fields
(orchestrator/plan/megatron_fields.py: the plan side's one translation of the decoder's
family and shape, plan.json's `transformer_fields`) and the parallel sizes (`ParallelDims`,
as megatron's parallel state has them) into the config that the model's layers, DDP and the
pipeline schedule read. The job builds its one config through it from the Plan
(orchestrator/train/megatron_config.transformer_config); what builds a model without a run
(`convert --verify`, the tests' reference models) calls it with the same plan-side fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from megatron.core.transformer import TransformerConfig

from orchestrator.plan.parallel_dims import ParallelDims
from orchestrator.runtime.distributed import megatron_parallel_fields


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """HF `gelu_pytorch_tanh` (Gemma's hidden_activation)."""
    return F.gelu(x, approximate="tanh")


# decoder_families.DecoderFamily.activation (the fields' `activation_func` name) -> the
# function on the gate half of fc1
ACTIVATIONS = {"gelu_tanh": gelu_tanh, "silu": F.silu}


@dataclass
class DecoderTransformerConfig(TransformerConfig):
    """TransformerConfig plus the decoder fields megatron-core has no place for."""

    attn_logit_softcapping: Optional[float] = None  # cap*tanh(score/cap) before the mask
    final_logit_softcapping: Optional[float] = None  # cap*tanh(logit/cap) before the loss
    # Sliding window (tokens, current one included) on all layers but every window_pattern-th.
    sliding_window: Optional[int] = None
    # model.decoder.family (orchestrator/plan/decoder_families.py): the layer spec reads it.
    decoder_family: str = "gemma2"
    # RoPE scaling factor (decoder_families.DecoderFamily.rope_scaling says which: Llama 3's
    # frequency scaling, megatron's rope_scaling, or Gemma 3's linear one, megatron's
    # seq_len_interpolation_factor), None for none.
    rope_scaling_factor: Optional[float] = None
    # Every window_pattern-th layer attends globally (decoder_families; 2: Gemma2's even layers).
    window_pattern: int = 2
    # Gemma 3: the sliding layers' RoPE base (unscaled); None: one RoPE for every layer.
    rope_local_theta: Optional[float] = None


def build_transformer_config(fields: dict[str, Any], dims: ParallelDims = ParallelDims(),
                             params_dtype: torch.dtype = torch.float32, *, on_gpu: bool = False,
                             gradient_accumulation_fusion: bool = False, **overrides) -> DecoderTransformerConfig:
    """The config of the model whose megatron `fields` these are, at `dims`, computing in
    `params_dtype`. `gradient_accumulation_fusion`: the weight gradient accumulated inside
    the GEMM (a GPU with apex's kernel only: orchestrator/runtime/machine.decide).
    `overrides`: fields a caller sets beyond the plan's (the job's loss normalisation; the
    tests' known-mistake controls)."""
    if dims.sp and dims.tp == 1:
        raise ValueError("sequence parallel (parallel.sp=true) needs tensor parallel size > 1 (parallel.tp=1)")
    unknown = sorted(set(fields) - set(DecoderTransformerConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"megatron fields that {DecoderTransformerConfig.__name__} does not have: {unknown}")
    kwargs = dict(fields)
    kwargs["activation_func"] = ACTIVATIONS[fields["activation_func"]]
    kwargs.update(
        megatron_parallel_fields(dims),
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        # megatron makes each full master weight on the host and splits it: TP=1 and TP=2
        # start from the same weights (on a GPU the job draws them there: device_draws).
        use_cpu_initialization=True,
        gradient_accumulation_fusion=on_gpu and gradient_accumulation_fusion,
    )
    kwargs.update(overrides)
    return DecoderTransformerConfig(**kwargs)


def decoder_transformer_config(decoder, dims: ParallelDims = ParallelDims(),
                               params_dtype: torch.dtype = torch.float32, **overrides) -> DecoderTransformerConfig:
    """The config of a model with this decoder (`model.decoder`, e.g. read from a HF
    checkpoint) at `dims`, where no run planned it (`convert --verify`, the GPU acceptance's
    HF parity rows, the tests' reference models): the plan side's translation of a model
    section with the default backend and no recompute, through the same builder as the job.
    It equals a CPU job's config at that layout but for what only the job's training sets
    (its per-token loss normalisation)."""
    from orchestrator.plan.megatron_fields import transformer_fields
    from orchestrator.plan.schema import ModelConfig, ParallelConfig

    fields = transformer_fields(ModelConfig(decoder=decoder), ParallelConfig(), on_gpu=False)
    return build_transformer_config(fields, dims, params_dtype, **overrides)
