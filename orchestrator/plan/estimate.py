"""Parameters, memory, FLOPs and throughput of a run, estimated before it runs.

All formulas are closed-form, with their sources:
- Bytes per parameter with mixed precision and Adam: 2 (bf16 weight) + 4 (fp32 grad)
  + 12 (fp32 master weight, exp_avg, exp_avg_sq); the distributed optimizer shards the
  12 over the data-parallel(xCP) group (Megatron-LM docs, "Distributed Optimizer":
  18 bytes/param non-distributed, 6 + 12/d distributed, with fp32 grads).
- Activation memory per transformer layer follows the accounting of Korthikanti et
  al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", Sec. 4):
  every tensor saved for backward, counted per element and dtype, generalised here to
  Gemma2's sandwich norms, GQA, GeGLU and separate head_dim; sequence parallel divides
  the norm/residual tensors by TP, context parallel divides the sequence; flash/fused
  attention (model.attention flex) keeps no s x s tensor, the reference attention keeps
  three (scores, softcapped scores, probabilities). Full recompute keeps each layer's input only, plus
  one recompute chunk's full activations. The micro-batches a stage holds at once follow
  megatron's schedule, simulated step by step (1F1B: min(pp - stage, micro-batches),
  Narayanan et al. 2021; interleaved: per model chunk). The terms per tensor are those the
  full-size probe measures (orchestrator/probe/, docs/memory.md).
- Model FLOPs: the job's own count (orchestrator/plan/step_flops.py, which states its
  conventions) applied to a planned step of full rows: 2 x matmul parameters per token
  forward (decoder, encoder per position, adapter and CTC head per audio token) plus
  the attention score and value products 2 x 2 x heads x head_dim per attended (query,
  key) pair (causal; sliding-window layers: at most the window); backward: the weight
  gradient where the weight trains, the input gradient where anything before it trains
  (so frozen weights under LoRA cost 1x, not 2x); hardware FLOPs add the recomputed
  forward (Chowdhery et al. 2022, Appendix B: MFU counts model FLOPs only, not
  recomputation).
A stated margin (MEMORY_MARGIN, FIXED_OVERHEAD_GIB) covers the CUDA context, NCCL
buffers and allocator fragmentation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Optional

from orchestrator.plan.decoder_families import family_of
from orchestrator.plan.kernels import (LOSS_CHUNK_ELEMENTS, LOSS_CHUNK_FP32_COPIES, attention_kernel, encoder_precision,
                                       loss_compiles, planned_compile)
from orchestrator.plan import schedule
from orchestrator.plan.megatron_args import padded_vocab_size
from orchestrator.plan.adapter_kinds import adapter_kind, frames_per_token
from orchestrator.plan.model_params import ParamSpec, audio_tokens_per_clip, clip_read_frames, encoder_frame_count, parameter_inventory
from orchestrator.plan.schema import AudioLLMConfig, ModelConfig, ParallelConfig
from orchestrator.plan.step_flops import StepFlops, causal_pairs

GIB = 1024**3
MEMORY_MARGIN = 0.10  # fraction added to the computed total
FIXED_OVERHEAD_GIB = 2.0  # CUDA context, NCCL buffers, allocator reserve


@dataclass(frozen=True)
class Device:
    name: str
    memory_gib: float  # usable device memory
    peak_tflops: float  # dense bf16 tensor-core peak


DEVICES = {
    "h100": Device("H100 SXM 80GB", 79.1, 989.0),
    "h200": Device("H200 141GB", 139.8, 989.0),
    "a100": Device("A100 SXM 80GB", 79.1, 312.0),
    "cpu": Device("CPU", float("inf"), 0.0),
}


@dataclass
class StageParams:
    """Parameters held by one rank of a pipeline stage (after TP sharding)."""

    stage: int
    by_component: dict[str, int] = field(default_factory=dict)
    trainable: int = 0
    frozen: int = 0
    fp32: int = 0  # parameters kept in fp32 beside a bf16 decoder (a frozen encoder at precision=fp32)

    @property
    def total(self) -> int:
        return self.trainable + self.frozen


@dataclass
class MemoryEstimate:
    weights_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    overhead_gib: float
    total_gib: float
    device_gib: float
    stage: int  # the pipeline stage with the largest total

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.device_gib


@dataclass
class FlopsEstimate:
    model_flops_per_step: float
    hardware_flops_per_step: float
    tokens_per_step: int


def _stage_of_layer(layer: int, num_layers: int, pp: int) -> int:
    return layer // (num_layers // pp)


def stage_params(inventory: list[ParamSpec], model: ModelConfig, parallel: ParallelConfig,
                 encoder_fp32: bool = True) -> list[StageParams]:
    """Per-rank parameter counts for each pipeline stage. The encoder, adapter and word
    embeddings live on the first stage; the final norm (and, when embeddings are tied and
    pp > 1, megatron's copy of the embedding as output layer) on the last. Weights are in
    the compute dtype (models.audiollm.build_audiollm), but `encoder_fp32`: the encoder's
    are fp32 (kernels.encoder_precision; a trained one never is beside a bf16 decoder)."""
    pp, tp = parallel.pp, parallel.tp
    stages = [StageParams(stage=s) for s in range(pp)]

    def add(stage: StageParams, spec: ParamSpec) -> None:
        n = spec.numel // tp if spec.tp_split_dim is not None else spec.numel
        stage.by_component[spec.component] = stage.by_component.get(spec.component, 0) + n
        if spec.trainable:
            stage.trainable += n
        else:
            stage.frozen += n
        if spec.component == "encoder" and encoder_fp32:
            stage.fp32 += n

    for spec in inventory:
        if spec.layer is not None:
            add(stages[_stage_of_layer(spec.layer, model.decoder.num_layers, pp)], spec)
        elif spec.name.endswith("final_layernorm.weight") or spec.name.startswith("language_model.output_layer"):
            add(stages[-1], spec)
        else:
            add(stages[0], spec)
            if pp > 1 and spec.name == "language_model.embedding.word_embeddings.weight" and model.decoder.tie_embeddings:
                add(stages[-1], spec)
    return stages


def decoder_layer_activation_bytes(model: ModelConfig, parallel: ParallelConfig, seq: int, mbs: int, dtype_bytes: int,
                                   attention: str, fused_norms: bool = True, compiled: bool = False,
                                   linears_train: bool = True) -> float:
    """Bytes saved for backward by one Gemma2 decoder layer for one micro-batch, with the
    `attention` kernel ("reference" or "flex", orchestrator.plan.kernels); `fused_norms`: the
    norms are one kernel each (GPUs: compiled or TransformerEngine's) rather than eager
    PyTorch (CPUs). Under context parallelism a rank holds seq / cp tokens, but its
    attention keeps the whole row's keys and values (gathered over the CP group) and
    scores its queries against all of them (orchestrator.models.attention). The counts
    per term are those the full-size probe measures (orchestrator/probe/); `compiled`
    (model.compile=layers): what the compiled layer keeps (compiled_layer_activation_bytes),
    with `linears_train` (the decoder's linear weights train: no LoRA, no freeze)."""
    if compiled:
        return compiled_layer_activation_bytes(model, seq, mbs, dtype_bytes, attention, parallel, linears_train)
    dec = model.decoder
    t, s, b, h = parallel.tp, seq / parallel.cp, mbs, dec.hidden_size
    sp_div = t if parallel.sp else 1
    family = family_of(dec)
    # The residual stream [s, b, h]: the inputs of the norms (4 with Gemma2's sandwich, else
    # the 2 pre-norms) and the normed inputs of QKV and fc1; eager norms also keep their
    # normalised inputs before the scale.
    norms = 4 if family.sandwich_norms else 2
    stream = (norms + 2 + (0 if fused_norms else 2)) * s * b * h * dtype_bytes / sp_div
    q = dec.num_attention_heads * dec.kv_channels
    kv = 2 * dec.num_query_groups * dec.kv_channels
    # K and V of the whole row (gathered over the CP group), as the kernel keeps them
    row_kv = kv * seq * b * dtype_bytes / t
    if attention == "reference":
        # QKV's output, the rotated Q, the heads' layout and the context; fp32 scores
        # (masked) and probabilities [b, heads, s, row]
        attention_bytes = (4 * q + kv) * s * b * dtype_bytes / t + row_kv
        attention_bytes += 2 * dec.num_attention_heads * s * seq * b * 4 / t
    else:
        # QKV's output, the rotated Q and K, the kernel's Q and output; its fp32
        # log-sum-exp [b, heads, s]
        attention_bytes = (3 * q + 1.5 * kv) * s * b * dtype_bytes / t + row_kv
        attention_bytes += dec.num_attention_heads * s * b * 4 / t
    if family.qk_norm:
        # QK-norm (qwen3): the contiguous queries and keys its norms keep as their inputs
        attention_bytes += (q + kv / 2) * s * b * dtype_bytes / t
    # fc1's output [gate; up] (2 f), GeGLU's activation, its tanh-GELU work and its product
    mlp = 5 * dec.ffn_hidden_size * s * b * dtype_bytes / t
    return stream + attention_bytes + mlp


def compiled_layer_activation_bytes(model: ModelConfig, seq: int, mbs: int, dtype_bytes: int, attention: str,
                                    parallel: Optional[ParallelConfig] = None, linears_train: bool = True) -> float:
    """Bytes one decoder layer compiled whole (model.compile=layers) keeps for its backward
    for one micro-batch: what the compiler's partitioner saves of the joint forward and
    backward graph, which recomputes cheap element-wise work (the norms' outputs, the
    rotary embedding) from fewer tensors instead. Its choice depends on the kernels and the
    sizes (docs/memory.md). With the reference attention (a CPU, fp32), as inductor's
    compiled layer keeps it (tests/models/test_compile.py): 5 [s, b, h] tensors of the
    residual stream (the layer's input, the normed inputs of QKV and fc1, the two residual
    sums); fc1's output [gate; up] and GeGLU's product (3 f); Q, K and V repeated to every
    head, the context, the scores and probabilities in the compute dtype and the softmax's
    two fp32 statistics per head. With flex (a GPU, bf16), as the probe's compiled layers
    keep it at gemma2-2b and 9b size (orchestrator/probe/compiled.py, within 1 %): 4 [s, b,
    h], 4 f, and the attention's below. Not counted (about 1 % at gemma2-2b): the norms'
    fp32 reciprocal RMS per token, LoRA's rank-wide intermediates, and the rotary table,
    which every layer shares.

    On a rank of `parallel`'s layout: its seq / cp tokens; the heads, the FFN and the
    attention's tensors divided over TP; the residual stream too under sequence
    parallelism but for the normed inputs of QKV and fc1 where the linears' weights train
    (`linears_train`; not with LoRA or a frozen decoder), which their weight gradients
    read as the all-gathered, whole sequence. Against the probe at gemma2-2b size with
    LoRA (flex, bf16): TP 2 with SP and CP 2 within 1.2 %, TP 2 without SP 4 % under it."""
    tp = parallel.tp if parallel is not None else 1
    cp = parallel.cp if parallel is not None else 1
    sp = tp > 1 and parallel is not None and parallel.sp
    dec = model.decoder
    tokens, h = seq / cp * mbs, dec.hidden_size
    q = dec.num_attention_heads * dec.kv_channels
    kv = 2 * dec.num_query_groups * dec.kv_channels
    streams = 5 if attention == "reference" else 4
    # the stream's tensors per token, in units of h: sharded over TP under SP but for the
    # two normed inputs the trained linears keep gathered
    stream = (streams - 2) / tp + 2 * (1 if linears_train else 1 / tp) if sp else streams
    if attention == "reference":
        # scores and probabilities of each query against the whole row (all of it under CP)
        attention_bytes = 4 * q * dtype_bytes + 2 * dec.num_attention_heads * (seq * dtype_bytes + 4)
        return tokens * (stream * h * dtype_bytes + (3 * dec.ffn_hidden_size * dtype_bytes + attention_bytes) / tp)
    # flex, in bf16 on a GPU: Q and K after the rotary embedding, V as a view of the fused
    # QKV output (which it keeps whole), the kernel's output and its [s, b, h] copy for the
    # output projection, the log-sum-exp; GeGLU's activation kept, not recomputed (4 f).
    attention_bytes = (q + kv // 2 + (q + kv) + 2 * q) * dtype_bytes + dec.num_attention_heads * 4
    return tokens * (stream * h * dtype_bytes + (4 * dec.ffn_hidden_size * dtype_bytes + attention_bytes) / tp)


def encoder_activation_bytes(model: ModelConfig, clips: int, frames: int, dtype_bytes: int) -> float:
    """Bytes saved for backward by a trainable Whisper encoder for `clips` clips of `frames`
    positions: per layer 8 [frames, d] tensors (norm inputs, Q, K, V, context,
    projections), 2 [frames, ffn] and the attention's own: in fp32 (HF's eager attention)
    the probabilities, in bf16 (SDPA's fused kernels on a GPU) one fp32 log-sum-exp per
    row; then the log-mel input and the two convolutions' inputs and outputs."""
    enc = model.encoder
    s, d, f, a = frames, enc.d_model, enc.ffn_dim, enc.num_heads
    attention = a * s * s * 4 if dtype_bytes == 4 else a * s * 4
    per_layer = ((8 * s * d + 2 * s * f) * dtype_bytes + attention) * clips
    front = (enc.num_mel_bins * 2 * s + 2 * d * 2 * s + d * s) * dtype_bytes * clips
    return per_layer * enc.num_layers + front


def adapter_activation_bytes(model: ModelConfig, clips: int, frames: int, encoder_bytes: int,
                             encoder_trains: bool, adapter_bytes: int) -> tuple[float, float]:
    """(kept for the backward, transient) bytes of the adapter (orchestrator/models/adapters.py)
    for `clips` clips of `frames` encoder frames. layer_mix: its learned mix of the encoder's
    layer outputs keeps every one of them, as the encoder made them, for the mix weights'
    gradient (kept anyway when the encoder trains), and while it sums or reads one it holds
    an fp32 copy and a product; then five tensors of the clips' size in the adapter's dtype
    (`adapter_bytes`; as the full-size probe counts them): the mix, the frames stacked for
    the first linear, its output, the activation's output and what the second linear
    reads. voxtral: the stacked frames, the first linear's output and the activation's;
    qwen2_audio: the pooled frames and their norm. With the auxiliary CTC loss
    (model.adapter.ctc_weight), its head's fp32 log-probabilities over the vocabulary and
    their padded copy. Nothing is kept for a frozen adapter."""
    if model.adapter.freeze:
        return 0.0, 0.0
    kind = adapter_kind(model.adapter)
    elements = clips * frames * model.encoder.d_model
    tokens = clips * (frames // frames_per_token(model.adapter))
    transient = 0.0
    if kind.layer_mix:
        mix = 0 if encoder_trains else model.encoder.num_layers * elements * encoder_bytes
        kept = mix + 5 * elements * adapter_bytes
        transient = 2 * elements * 4
    elif kind.pool > 1:
        kept = 2 * tokens * model.encoder.d_model * adapter_bytes
    else:
        kept = (elements + 2 * tokens * model.decoder.hidden_size) * adapter_bytes
    ctc = 0.0
    if float(model.adapter.ctc_weight) > 0:  # the CTC head's log-probabilities, and their padded copy
        ctc = 2 * tokens * (model.decoder.vocab_size + 1) * 4
    return kept + ctc, transient


def loss_peak_bytes(logits: float, dtype_bytes: int, compiled: bool = False, softcap: bool = True) -> float:
    """Bytes of the final softcap and cross entropy (DecoderModel.softcapped_loss) at their
    peak, for `logits` logits of the rank. The work per logit: with the `softcap` three
    fp32 copies (the capped logits, the softmax kept, then the gradient); without it (every
    family but gemma2) one fp32 copy (megatron's softmax, computed and differentiated in
    place) beside the logits' transposed copy in the compute dtype. Unchunked (at most
    LOSS_CHUNK_ELEMENTS): that work over all logits. Chunked: the output layer's logits
    (in the compute dtype) kept whole for the checkpointed chunks; in the backward either
    one chunk's recomputed work beside the logits' gradient, or the gradient's accumulation
    over the chunks, whose slices autograd widens to the whole logits (one copy a chunk, at
    most three), whichever is larger. As measured by the full-size probe
    (orchestrator/probe/; without the softcap at 1024, 2048 and 3072 tokens of a 128256
    vocabulary: one, two and three chunks). Compiled (model.compile=layers: one call over the
    whole micro-batch, its fp32 work fused): two copies of the logits in the compute dtype at
    any moment (the output layer's and megatron's transposed copy at the end of the forward;
    the gradient and, at micro-batches above 1, its copy laid out again for the output
    layer, DecoderModel's _LogitsGradAsOneMatrix, in the backward), as the probe counts the
    compiled loss at gemma2-2b and 9b size."""
    if compiled:
        return logits * dtype_bytes * 2
    work = LOSS_CHUNK_FP32_COPIES * 4 if softcap else 4 + dtype_bytes  # bytes per logit
    if logits <= LOSS_CHUNK_ELEMENTS:
        return work * logits
    whole = logits * dtype_bytes
    chunks = math.ceil(logits / LOSS_CHUNK_ELEMENTS)
    return whole + max(whole + work * LOSS_CHUNK_ELEMENTS, min(3, chunks) * whole)


def clips_in_a_row(cfg: AudioLLMConfig) -> int:
    """Most audio clips a packed row can hold: each clip takes at least its audio tokens."""
    tokens = audio_tokens_per_clip(cfg.data.max_audio_seconds, cfg.model, cfg.data.audio_tokens)
    return max(1, cfg.data.seq_length // max(tokens, 1))


def clips_per_row(cfg: AudioLLMConfig) -> int:
    """Most audio clips one rank encodes for a row: all of them, or under context
    parallelism the clips inside its two chunks and one more at each chunk end that is
    not the row's end nor shared with its other chunk (a clip straddling a chunk boundary
    is encoded by both ranks): two at CP=2, four for the middle ranks beyond."""
    whole_row = clips_in_a_row(cfg)
    cp = cfg.parallel.cp
    return whole_row if cp == 1 else min(whole_row, math.ceil(whole_row / cp) + (2 if cp == 2 else 4))


def _held(pp: int, vpp: int | None, microbatches: int, stage: int):
    """The micro-batches each model chunk of a stage holds, after every step of its schedule."""
    held = [0] * (vpp or 1)
    for step, chunk, _ in schedule.order(pp, vpp, microbatches, stage):
        held[chunk] += 1 if step == "F" else -1
        yield held


def in_flight(pp: int, vpp: int | None, microbatches: int, stage: int) -> tuple[int, list[int]]:
    """(most micro-batch chunks held at once, most held of each model chunk) on a stage."""
    most, most_each = 0, [0] * (vpp or 1)
    for held in _held(pp, vpp, microbatches, stage):
        most = max(most, sum(held))
        most_each = [max(a, b) for a, b in zip(most_each, held)]
    return most, most_each


def peak_held_bytes(pp: int, vpp: int | None, microbatches: int, stage: int, chunk_bytes: list[float]) -> float:
    """The most a stage's forwards keep at once: each model chunk's bytes per micro-batch
    times the micro-batches it holds, at the schedule's worst moment."""
    return max(sum(n * b for n, b in zip(held, chunk_bytes)) for held in _held(pp, vpp, microbatches, stage))


def probe_microbatches(pp: int, vpp: int | None, microbatches: int) -> int:
    """The fewest micro-batches per step (a multiple of pp under interleaving) with which
    every stage holds as much, chunk by chunk, as with `microbatches`: what the full-size
    probe runs (orchestrator/probe/)."""
    if pp == 1:
        return 1
    wanted = [in_flight(pp, vpp, microbatches, stage) for stage in range(pp)]
    step = pp if vpp else 1
    for count in range(step, microbatches, step):
        if [in_flight(pp, vpp, count, stage) for stage in range(pp)] == wanted:
            return count
    return microbatches


def memory_per_gpu(cfg: AudioLLMConfig, stages: list[StageParams], dp: int, num_microbatches: int) -> MemoryEstimate:
    """The estimate of the pipeline stage that needs the most memory per GPU."""
    return max(memory_by_stage(cfg, stages, dp, num_microbatches), key=lambda estimate: estimate.total_gib)


def memory_by_stage(cfg: AudioLLMConfig, stages: list[StageParams], dp: int,
                    num_microbatches: int) -> list[MemoryEstimate]:
    """Memory per GPU of each pipeline stage's ranks."""
    parallel, model, optim = cfg.parallel, cfg.model, cfg.optim
    device = DEVICES["cpu"] if cfg.launcher.accelerator == "cpu" else DEVICES[cfg.launcher.gpu_type]
    low_precision = cfg.launcher.accelerator == "gpu"
    weight_bytes = 2 if low_precision else 4
    shard = dp * parallel.cp if parallel.distributed_optimizer else 1
    pp = parallel.pp
    layers_per_stage = model.decoder.num_layers // pp
    compiled = planned_compile(cfg) == "layers"
    layer_act = decoder_layer_activation_bytes(model, parallel, cfg.data.seq_length, optim.micro_batch_size, weight_bytes,
                                               attention_kernel(model.attention, on_gpu=low_precision),
                                               fused_norms=low_precision, compiled=compiled,
                                               linears_train=not (model.decoder.freeze or cfg.lora.rank))
    rc = parallel.recompute
    if rc.granularity == "full":
        input_only = weight_bytes * cfg.data.seq_length / parallel.cp * optim.micro_batch_size * model.decoder.hidden_size
        input_only /= parallel.tp if parallel.sp else 1
        chunk = rc.num_layers if rc.method == "uniform" else layers_per_stage
        checkpointed = layers_per_stage if rc.method == "uniform" else min(rc.num_layers, layers_per_stage)
        per_microbatch = checkpointed * input_only + (layers_per_stage - checkpointed) * layer_act
        transient = chunk * layer_act  # one chunk's activations rebuilt during its backward
    else:
        per_microbatch = layers_per_stage * layer_act
        transient = 0.0
    vpp = parallel.vpp if pp > 1 else None
    encoder_trains = not model.encoder.freeze or (cfg.lora.rank > 0 and cfg.lora.encoder)
    encoder_bytes = 4 if encoder_precision(model.encoder.precision, low_precision) == "fp32" else 2
    clips = clips_per_row(cfg) * optim.micro_batch_size
    frames = encoder_frame_count(_mel_frames(cfg))
    adapter_kept, adapter_transient = adapter_activation_bytes(model, clips, frames, encoder_bytes, encoder_trains,
                                                               weight_bytes)
    first_stage = adapter_kept + (encoder_activation_bytes(model, clips, frames, encoder_bytes) if encoder_trains
                                  else 0.0)
    estimates = []
    for stage in stages:
        weights = (stage.total - stage.fp32) * weight_bytes + stage.fp32 * 4
        grads = stage.trainable * 4
        # fp32 main weights for the optimizer where the weights are bf16 (all that train)
        master = 4 * stage.trainable if low_precision else 0
        optimizer = (stage.trainable * 8 + master) / shard
        # each model chunk holds its share of the stage's layers; the first stage's first
        # chunk also the encoder side
        chunk_bytes = [per_microbatch / (vpp or 1)] * (vpp or 1)
        if stage.stage == 0:
            chunk_bytes[0] += first_stage
        activations = peak_held_bytes(pp, vpp, num_microbatches, stage.stage, chunk_bytes)
        peaks = [transient]  # what one part of the step adds at its own moment
        if stage.stage == 0:
            peaks.append(adapter_transient)
        if stage.stage == pp - 1:
            # The output layer's rows on one TP rank (not stage 0's "embedding" parameters,
            # which an untied output layer at PP 1 doubles).
            vocab_shard = padded_vocab_size(model.decoder.vocab_size, parallel.tp) / parallel.tp
            logits = cfg.data.seq_length / parallel.cp * optim.micro_batch_size * vocab_shard
            peaks.append(loss_peak_bytes(logits, weight_bytes, compiled and loss_compiles(parallel.tp),
                                         softcap=model.decoder.final_logit_softcap is not None))
        activations += max(peaks)
        subtotal = (weights + grads + optimizer + activations) / GIB
        total = subtotal * (1 + MEMORY_MARGIN) + (FIXED_OVERHEAD_GIB if low_precision else 0.0)
        estimate = MemoryEstimate(
            weights_gib=weights / GIB,
            grads_gib=grads / GIB,
            optimizer_gib=optimizer / GIB,
            activations_gib=activations / GIB,
            overhead_gib=total - subtotal,
            total_gib=total,
            device_gib=device.memory_gib,
            stage=stage.stage,
        )
        estimates.append(estimate)
    return estimates


def _mel_frames(cfg: AudioLLMConfig) -> int:
    """Mel frames the encoder runs over per clip: the frames it reads of the clip
    (model.encoder.mask_padding: read_frames, the whole window under
    data.audio_tokens=window), or the whole window."""
    if not cfg.model.encoder.mask_padding:
        return 2 * cfg.model.encoder.max_source_positions
    return clip_read_frames(cfg.data.max_audio_seconds, cfg.model, cfg.data.audio_tokens)


def planned_step_items(cfg: AudioLLMConfig) -> dict:
    """What a planned step holds, in orchestrator.plan.step_flops' terms: every row full
    (one document of data.seq_length tokens) and as many clips of data.max_audio_seconds
    as a row can hold (clips_in_a_row: each counted once, though under context parallelism
    a clip astride two ranks' chunks is encoded by both), each clip's encoder over its own
    frames when model.encoder.mask_padding is on, else over the whole window."""
    model, rows, seq = cfg.model, cfg.optim.global_batch_size, cfg.data.seq_length
    window = model.decoder.sliding_window or None
    clips = clips_in_a_row(cfg) * rows
    mel = _mel_frames(cfg)
    frames = encoder_frame_count(mel)
    return {"token": rows * seq, "pair_full": rows * causal_pairs(seq), "pair_window": rows * causal_pairs(seq, window),
            "mel_frame": clips * mel, "enc_position": clips * frames, "enc_pair": clips * frames**2,
            "audio_token": clips * audio_tokens_per_clip(cfg.data.max_audio_seconds, model, cfg.data.audio_tokens)}


def flops_per_step(cfg: AudioLLMConfig, inventory: list[ParamSpec]) -> FlopsEstimate:
    """Model and hardware FLOPs of a planned step (planned_step_items) by the job's own
    arithmetic (orchestrator.plan.step_flops: decoder, encoder, adapter and CTC head;
    backward per weight that trains; recompute). Its time: layout_estimate.py."""
    model, parallel = cfg.model, cfg.parallel
    vocab = padded_vocab_size(model.decoder.vocab_size, parallel.tp)
    counter = StepFlops(model, cfg.lora.rank, parallel.recompute, vocab, [p.name for p in inventory if p.trainable],
                        pp=parallel.pp, vpp=parallel.vpp)
    items = planned_step_items(cfg)
    flops = counter.flops(items)
    return FlopsEstimate(model_flops_per_step=flops["model"], hardware_flops_per_step=flops["hardware"],
                         tokens_per_step=items["token"])


def inventory_for(cfg: AudioLLMConfig) -> list[ParamSpec]:
    """The parameters as the job trains them: the model and LoRA config's, then every
    trainable parameter whose first matching lora.lr_groups entry has lr_scale 0 frozen
    (orchestrator/train/lr_groups.py)."""

    def frozen_by_group(name: str) -> bool:
        for group in cfg.lora.lr_groups:
            if any(fnmatchcase(name, pattern) for pattern in group.patterns):
                return group.lr_scale == 0
        return False

    return [replace(spec, trainable=False) if spec.trainable and frozen_by_group(spec.name) else spec
            for spec in parameter_inventory(cfg.model, cfg.lora, cfg.parallel.tp)]


def parameter_totals(inventory: list[ParamSpec]) -> dict[str, dict[str, int]]:
    """Whole-model parameter counts by component, trainable and frozen."""
    totals: dict[str, dict[str, int]] = {}
    for spec in inventory:
        entry = totals.setdefault(spec.component, {"trainable": 0, "frozen": 0})
        entry["trainable" if spec.trainable else "frozen"] += spec.numel
    return totals

