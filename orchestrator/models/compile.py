"""Regional compilation (`model.compile: layers`): every decoder and encoder layer compiled whole.

On a GPU without TransformerEngine the step is bound by the host: each decoder layer's
norms, projections, rotary embedding, softcap, GeGLU and residuals are dozens of small
kernels, each launched from Python through megatron's modules. `torch.compile` of a
whole layer (fullgraph: one graph, no break; torchtitan compiles its blocks the same
way) turns that into a few fused kernels per layer, and its backward into one compiled
graph too; the Whisper encoder's layers (HF's WhisperEncoderLayer) likewise. Each
decoder layer's arithmetic (`Gemma2TransformerLayer.sandwich`) and each encoder layer's
forward is compiled in place, so parameter names, checkpoints, LoRA, freezing, DDP's hooks and megatron's
activation recomputation (which calls the layer again) see the same modules as without, and
module hooks on the layers run eagerly around the graphs.
The layer's own forward stays eager around it: it looks up the flex block mask of the
micro-batch (`prepare_mask`), which no graph can do, and decoding through the KV cache
does not use the compiled graph.

The last pipeline stage's softcapped loss (`softcapped_cross_entropy`) is compiled too:
eagerly, the softcap and the cross entropy over a 256000-token vocabulary are a dozen
fp32 element-wise passes over the logits per micro-batch (a quarter of an H200's GPU time
in the compiled-layers step); compiled, a few fused ones, with no fp32 copy of the
logits kept for the backward.

What megatron-core 0.16.1 does inside a layer that stops a fullgraph trace, and how it
is met (found with `torch._dynamo.explain` on the tiny model; tests/models/test_compile.py):
both are calls of `warnings.warn`, which dynamo cannot trace, and `quiet_megatron_warnings()`
removes them:
- `RowParallelLinear.forward` passes `tp_group=None` down, and
  `get_tensor_model_parallel_group_if_none` then warns (a DeprecationWarning) on every
  call before returning the default group: each row-parallel linear broke the graph in
  two. The helper is replaced, in the module that calls it, by one that returns the same
  group without the warning.
- `linear_with_grad_accumulation_and_async_allreduce` advises, once per process, to set
  CUDA_DEVICE_MAX_CONNECTIONS=1 under sequence parallelism; the job sets it on GPUs
  with TP or CP (orchestrator.runtime.distributed.cuda_environment), and a CPU has no
  such queue. Its own "warned" flag is set.

Shapes: each distinct micro-batch width is one compilation (static shapes, as the flex
kernel has); training rows are packed to the sequence length, so training sees one or
a few. The layers share one compiled code object: windowed and global layers are two
variants of it, times widths, times training and evaluation; the recompile limit is
raised to cover those (RECOMPILE_LIMIT), past which dynamo would silently run the layer
eagerly.
"""

from __future__ import annotations

import inspect

import torch

from orchestrator.plan.kernels import COMPILE_CHOICES

# Compiled variants of the layer one process may need: 2 window variants x 2 grad modes x
# up to 16 widths (training's packed length, evaluation's last batches, decoding prefills).
RECOMPILE_LIMIT = 64


def quiet_megatron_warnings() -> None:
    """megatron's two warnings inside a layer's forward, gone (see the module docstring):
    the default tensor-parallel group returned without its per-call warning, and the
    once-per-process advice on CUDA_DEVICE_MAX_CONNECTIONS marked as given. Idempotent."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import layers

    layers.linear_with_grad_accumulation_and_async_allreduce.warned = True
    if getattr(layers.get_tensor_model_parallel_group_if_none, "quiet", False):
        return
    original = layers.get_tensor_model_parallel_group_if_none

    def get_group(tp_group, is_expert=False, check_initialized=True):
        if tp_group is not None or not torch.distributed.is_initialized() or not parallel_state.is_initialized():
            return original(tp_group, is_expert=is_expert, check_initialized=check_initialized)
        if is_expert:
            return parallel_state.get_expert_tensor_parallel_group(check_initialized=check_initialized)
        return parallel_state.get_tensor_model_parallel_group(check_initialized=check_initialized)

    get_group.quiet = True
    layers.get_tensor_model_parallel_group_if_none = get_group


def decoder_layers(model: torch.nn.Module) -> list:
    """The Gemma2 decoder layers of a model chunk (any wrapping: Float16Module, DDP)."""
    from orchestrator.models.gemma2_layer import Gemma2TransformerLayer

    return [m for m in model.modules() if isinstance(m, Gemma2TransformerLayer)]


def decoders(model: torch.nn.Module) -> list:
    """The Gemma2 decoders (megatron GPTModels) of a model chunk."""
    from orchestrator.models.gemma2_model import Gemma2Model

    return [m for m in model.modules() if isinstance(m, Gemma2Model)]


def encoder_layers(model: torch.nn.Module) -> list:
    """The Whisper encoder layers of a model chunk (HF's WhisperEncoderLayer)."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoderLayer

    return [m for m in model.modules() if isinstance(m, WhisperEncoderLayer)]


def compile_layers(model: torch.nn.Module, choice: str, backend="inductor") -> int:
    """`model.compile` applied to one model chunk: "layers" compiles each decoder layer's
    arithmetic and each encoder layer in place, fullgraph (after LoRA and the freezes,
    which it then sees as they are), and the last stage's softcapped loss; "none" leaves
    the chunk eager. Returns the number of layers compiled."""
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"model.compile={choice!r} is not one of {COMPILE_CHOICES}")
    if choice == "none":
        return 0
    quiet_megatron_warnings()
    options = dict(backend=backend, fullgraph=True, dynamic=False)
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        options["recompile_limit"] = RECOMPILE_LIMIT
    else:  # older torch: process-wide, a larger limit the user set is kept
        config = torch._dynamo.config
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, name, max(RECOMPILE_LIMIT, getattr(config, name)))
    layers = decoder_layers(model)
    for layer in layers:
        layer.compiled_sandwich = torch.compile(layer.sandwich, **options)
    from orchestrator.models.gemma2_model import softcapped_cross_entropy

    for decoder in decoders(model):
        if decoder.post_process:  # the last pipeline stage: the softcapped loss, fused
            decoder.compiled_loss = torch.compile(softcapped_cross_entropy, **options)
    encoder = encoder_layers(model)
    for layer in encoder:
        layer.forward = torch.compile(layer.forward, **options)  # its module hooks stay eager around it
    return len(layers) + len(encoder)
