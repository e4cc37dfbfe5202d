"""Regional compilation (`model.compile: layers`): every decoder and encoder layer compiled whole.

On a GPU without TransformerEngine the step is bound by the host: each decoder layer's
norms, projections, rotary embedding, softcap, GeGLU and residuals are dozens of small
kernels, each launched from Python through megatron's modules. `torch.compile` of a
whole layer (fullgraph: one graph, no break; torchtitan compiles its blocks the same
way) turns that into a few fused kernels per layer, and its backward into one compiled
graph too; the Whisper encoder's layers (HF's WhisperEncoderLayer) likewise. Each
decoder layer's arithmetic (`DecoderTransformerLayer.sandwich`) and each encoder layer's
forward is compiled in place, so parameter names, checkpoints, LoRA, freezing, DDP's hooks and megatron's
activation recomputation (which calls the layer again) see the same modules as without, and
module hooks on the layers run eagerly around the graphs.
The layer's own forward stays eager around it: it looks up the flex block mask of the
micro-batch (`prepare_mask`), which no graph can do, and decoding through the KV cache
does not use the compiled graph.

The last pipeline stage's softcapped loss (`softcapped_cross_entropy`) is compiled too
at TP = 1: eagerly, the softcap and the cross entropy over a 256000-token vocabulary are a
dozen fp32 element-wise passes over the logits per micro-batch (a quarter of an H200's GPU
time in the compiled-layers step); compiled, a few fused ones, with no fp32 copy of the
logits kept for the backward. Under tensor parallelism each rank holds a slice of the
vocabulary and the loss needs megatron's vocab-parallel cross entropy (its maximum and
sums all-reduced over the TP group): it stays eager there, in chunks.

Tensor and sequence parallelism inside a compiled layer: megatron's linears run their
matrix product in autograd Functions whose backward starts its all-reduce (or, under
sequence parallelism, its all-gather and reduce-scatter) with `async_op=True`, to
overlap it with the weight gradient, and dynamo traces no asynchronous collective. In a
compiled layer every megatron linear runs `traceable_linear` instead: the same product
and bias, with the layer's communication through megatron's synchronous mappings (the
all-gather of the sequence shards before a column-parallel linear, whose backward
reduce-scatters; or the identity whose backward all-reduces the input gradient), which
dynamo turns into functional collectives inside the graph, and the weight gradient by
autograd, into `.grad`, where megatron's DDP hook adds it to its buffer, as it does with
gradient-accumulation fusion off (with it on, megatron's backward calls apex's fused
kernel, a C extension dynamo cannot trace: on a machine with apex, a compiled layer would
have broken its graph there even at TP = 1; not run, no such machine here). What is lost
against eager: the overlap of those collectives with the weight gradient's product, which
a LoRA run, whose frozen weights have no gradient, never had. The all-gathers and
reduce-scatters of those mappings (and of context parallelism's keys and values) are
traced as functional collectives (`functional_sequence_collectives`): megatron's own,
writing into a buffer it allocates, gave zero gradients traced by torch 2.11.

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

from orchestrator.plan.kernels import COMPILE_CHOICES, loss_compiles

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


def functional_sequence_collectives() -> None:
    """megatron's all-gather and reduce-scatter along the first dimension (under sequence
    parallelism around the linears, under context parallelism the keys' and values'
    gather), as functional collectives while dynamo traces them: each returns a new
    tensor. megatron's own write into a buffer it allocates (`torch.empty`, then
    `all_gather_into_tensor` / `reduce_scatter_tensor` into it), traced inside the
    autograd Function of its mapping, lost the write under torch 2.11, the GPU machines'
    torch: the backward read the empty buffer, zero gradients (with torch 2.14 it is
    right; a megatron-free reproduction, docs/gpu-machines.md). Eager calls run megatron's
    code unchanged. Idempotent."""
    from megatron.core.tensor_parallel import mappings

    if getattr(mappings._gather_along_first_dim, "functional", False):
        return
    import torch.distributed._functional_collectives as funcol

    def traced(original, functional):
        def helper(input_, group, *options, **named):
            # uneven split sizes or megatron's global buffer, given by position or name: megatron's own
            if (not torch.compiler.is_compiling() or any(options) or any(named.values()) or group is None
                    or group.size() == 1):
                return original(input_, group, *options, **named)
            return functional(input_.contiguous(), group)

        helper.functional = True
        return helper

    mappings._gather_along_first_dim = traced(mappings._gather_along_first_dim,
                                              lambda x, group: funcol.all_gather_tensor(x, 0, group))
    mappings._reduce_scatter_along_first_dim = traced(mappings._reduce_scatter_along_first_dim,
                                                      lambda x, group: funcol.reduce_scatter_tensor(x, "sum", 0, group))


def traceable_linear(input, weight, bias=None, gradient_accumulation_fusion=False, allreduce_dgrad=False,
                     sequence_parallel=False, grad_output_buffer=None, wgrad_deferral_limit=None, tp_group=None):
    """megatron's `_forward_impl` of its Column/RowParallelLinear (same arguments), written
    so that dynamo traces it whole (see the module docstring): under sequence parallelism
    the input's sequence shards all-gathered (backward: reduce-scattered), else, where
    megatron would all-reduce the input gradient, the identity whose backward does; then
    the product and bias. The arithmetic of megatron's frozen-weight path, with autograd
    taking the weight gradient where the weight trains."""
    from megatron.core.tensor_parallel import mappings

    if grad_output_buffer is not None or wgrad_deferral_limit:
        raise NotImplementedError("deferred weight gradients (defer_embedding_wgrad_compute) in a compiled layer")
    if sequence_parallel:
        input = mappings.gather_from_sequence_parallel_region(input, tensor_parallel_output_grad=True, group=tp_group)
    elif allreduce_dgrad:
        input = mappings.copy_to_tensor_model_parallel_region(input, group=tp_group)
    output = torch.matmul(input, weight.t())
    return output if bias is None else output + bias


def make_linears_traceable(layer: torch.nn.Module) -> int:
    """Every megatron parallel linear in `layer` runs `traceable_linear` (an instance
    attribute over the class's method: parameters, state dicts and LoRA's subclass are
    unchanged, and eager calls, decoding through the KV cache among them, compute the same).
    Returns how many."""
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    linears = [m for m in layer.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    for linear in linears:
        linear._forward_impl = traceable_linear
    return len(linears)


def decoder_layers(model: torch.nn.Module) -> list:
    """The Gemma2 decoder layers of a model chunk (any wrapping: Float16Module, DDP)."""
    from orchestrator.models.decoder_layer import DecoderTransformerLayer

    return [m for m in model.modules() if isinstance(m, DecoderTransformerLayer)]


def decoders(model: torch.nn.Module) -> list:
    """The Gemma2 decoders (megatron GPTModels) of a model chunk."""
    from orchestrator.models.decoder_model import DecoderModel

    return [m for m in model.modules() if isinstance(m, DecoderModel)]


def encoder_layers(model: torch.nn.Module) -> list:
    """The Whisper encoder layers of a model chunk (HF's WhisperEncoderLayer)."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoderLayer

    return [m for m in model.modules() if isinstance(m, WhisperEncoderLayer)]


def compile_layers(model: torch.nn.Module, choice: str, backend="inductor") -> int:
    """`model.compile` applied to one model chunk: "layers" compiles each decoder layer's
    arithmetic (its linears made traceable) and each encoder layer in place, fullgraph
    (after LoRA and the freezes, which it then sees as they are), and at TP = 1 the last
    stage's softcapped loss; "none" leaves the chunk eager. Returns the number of layers
    compiled."""
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"model.compile={choice!r} is not one of {COMPILE_CHOICES}")
    if choice == "none":
        return 0
    quiet_megatron_warnings()
    functional_sequence_collectives()
    options = dict(backend=backend, fullgraph=True, dynamic=False)
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        options["recompile_limit"] = RECOMPILE_LIMIT
    else:  # older torch: process-wide, a larger limit the user set is kept
        config = torch._dynamo.config
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, name, max(RECOMPILE_LIMIT, getattr(config, name)))
    layers = decoder_layers(model)
    for layer in layers:
        make_linears_traceable(layer)
        layer.compiled_sandwich = torch.compile(layer.sandwich, **options)
    from orchestrator.models.decoder_model import softcapped_cross_entropy

    for decoder in decoders(model):
        # The last pipeline stage's softcapped loss, fused where the rank holds the whole vocabulary.
        if decoder.post_process and loss_compiles(decoder.config.tensor_model_parallel_size):
            decoder.compiled_loss = torch.compile(softcapped_cross_entropy, **options)
    encoder = encoder_layers(model)
    for layer in encoder:
        layer.forward = torch.compile(layer.forward, **options)  # its module hooks stay eager around it
    return len(layers) + len(encoder)
