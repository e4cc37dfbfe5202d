"""Bytes each GPU hands to collectives in one training step, by kind, before it runs.

Counted as the job runs megatron-core 0.16 without TransformerEngine (local backend):
each entry is a collective's payload on one rank, the tensor as the call sees it (an
all-gather's gathered output, a reduce-scatter's full input, an all-reduce's tensor, a
point-to-point send's tensor); what the wire carries follows from it by the ring factor
of the collective (`wire_factor`). tests/orchestrator/test_communication_measured.py compares
every kind with a real multi-process step whose collectives are wrapped and summed.

Per decoder layer and micro-batch, with A = b x s/cp x hidden activation elements:

- tp (tensor and sequence parallel, TP > 1). The layer has two column-parallel linears
  (QKV, fc1) and two row-parallel ones (proj, fc2). With sequence parallel: forward
  all-gathers each column-parallel input and reduce-scatters each row-parallel output
  (2 AG + 2 RS of A); backward reduce-scatters the column-parallel input gradients, all-
  gathers the row-parallel output gradients and, where the weight trains, all-gathers
  the column-parallel input again for its weight gradient (megatron keeps the sharded
  input only). Without sequence parallel: the row-parallel outputs are all-reduced
  forward and the column-parallel input gradients backward (4 AR of A). Full recompute
  repeats a layer's forward collectives in its backward. Outside the layers: the
  vocabulary-parallel embedding's all-reduce (first stage) and its scatter to the
  sequence-parallel region, whose backward is an all-gather; the output layer, a column-
  parallel linear, and the vocabulary-parallel cross entropy's three fp32 values per
  position (last stage); the layer norms' gradients, all-reduced over TP once a
  step under sequence parallel (each rank saw a part of the sequence).
- cp (context parallel, CP > 1): every layer all-gathers its keys and values over the
  CP group forward and reduce-scatters their gradients backward
  (orchestrator/models/attention.py); full recompute gathers again.
- pp (pipeline parallel, PP > 1): one activation tensor (b x s/cp x hidden, / TP under
  sequence parallel) sent forward and one gradient sent backward per micro-batch and
  model chunk boundary; with tied embeddings, the embedding's gradient all-reduced once a
  step between the first and the last stage (megatron's embedding group).
- dp (data parallel over DP x CP ranks, once a step): the trainable parameters'
  gradients in fp32 (grad_reduce_in_fp32), all-reduced; with the distributed optimizer
  reduce-scattered, then the updated parameters all-gathered in the model's dtype.
  megatron pads its gradient buffer (to a multiple of the DP size and per bucket); the
  count here is unpadded.

Scalars (the loss, token counts, the gradient norm, skipped-step flags) are left out:
a few dozen bytes a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("tp", "cp", "pp", "dp")


def wire_factor(collective: str, group_size: int) -> float:
    """Bytes one rank sends per payload byte in a ring (NCCL's bus-bandwidth convention):
    all-gather and reduce-scatter (n-1)/n, all-reduce 2(n-1)/n, a send 1."""
    if collective == "send":
        return 1.0
    if group_size <= 1:
        return 0.0
    ring = (group_size - 1) / group_size
    return {"all_gather": ring, "reduce_scatter": ring, "all_reduce": 2 * ring}[collective]


@dataclass
class Traffic:
    """Payload bytes per collective, summed over one step, of one rank."""

    stage: int
    by_kind: dict = field(default_factory=lambda: {kind: {} for kind in KINDS})

    def add(self, kind: str, collective: str, payload_bytes: float) -> None:
        if payload_bytes:
            entries = self.by_kind[kind]
            entries[collective] = entries.get(collective, 0.0) + payload_bytes

    def payload(self, kind: str) -> float:
        return sum(self.by_kind[kind].values())

    def total(self) -> float:
        return sum(self.payload(kind) for kind in KINDS)

    def wire_bytes(self, kind: str, sizes: dict, collectives=None) -> float:
        """Bytes this rank sends for `kind` (`collectives`: those only) in groups of `sizes`
        (tp, cp, pp, dp ranks)."""
        return sum(payload * wire_factor(collective, group_size(kind, collective, sizes))
                   for collective, payload in self.by_kind[kind].items()
                   if collectives is None or collective in collectives)


def group_size(kind: str, collective: str, sizes: dict) -> int:
    """The ranks a collective of `kind` runs among: the kind's group, except the tied
    embedding's gradient all-reduce, which megatron runs in its embedding group, the first
    and the last pipeline stage only (2 ranks, whatever the pipeline's depth)."""
    if kind == "pp" and collective == "all_reduce":
        return min(2, sizes["pp"])
    return sizes[kind]


COLUMN_PARALLEL = ("self_attention.linear_qkv", "mlp.linear_fc1")
ROW_PARALLEL = ("self_attention.linear_proj", "mlp.linear_fc2")


@dataclass(frozen=True)
class LayerTraining:
    """What trains in one decoder layer, as far as the collectives care."""

    column_weights: int  # column-parallel linears whose weight trains (backward re-gathers their input)
    column_lora: int  # LoRA-adapted column-parallel linears
    row_lora: int  # LoRA-adapted row-parallel linears
    sp_replicated: int  # trainable parameters replicated over TP (norms, LoRA's replicated factors)


@dataclass(frozen=True)
class StepShape:
    """What the counts depend on, read from a resolved configuration (`shape_of`)."""

    micro_batch: int
    seq_length: int
    hidden: int
    kv_width: int  # query groups x head dim, before TP
    lora_rank: int
    tp: int
    pp: int
    cp: int
    dp: int
    vpp: int
    sp: bool
    distributed_optimizer: bool
    tie_embeddings: bool
    padded_vocab: int
    num_microbatches: int
    activation_bytes: int  # 2 on GPU (bf16), 4 on CPU (fp32)
    layers: tuple  # LayerTraining per decoder layer
    full_recompute_layers: frozenset  # decoder layer indices recomputed whole
    final_norm_trains: bool
    embedding_trains: bool
    gradients_reach_embedding_output: bool  # something before the first layer trains (adapter, embedding)


def shape_of(cfg, dp: int, num_microbatches: int, inventory, full_recompute_layers) -> StepShape:
    """The StepShape of a validated AudioLLMConfig; `inventory` is estimate.inventory_for(cfg)
    (what trains), `full_recompute_layers` step_flops.recomputed_layers of its recompute."""
    from orchestrator.plan.megatron_args import padded_vocab_size

    model, parallel = cfg.model, cfg.parallel
    dec = model.decoder
    trains = {spec.name for spec in inventory if spec.trainable}
    prefix = "language_model.decoder.layers"
    layers = []
    for i in range(dec.num_layers):
        layer = f"{prefix}.{i}."
        layers.append(LayerTraining(
            column_weights=sum(f"{layer}{name}.weight" in trains for name in COLUMN_PARALLEL),
            column_lora=sum(f"{layer}{name}.lora_a.weight" in trains for name in COLUMN_PARALLEL),
            row_lora=sum(f"{layer}{name}.lora_a.weight" in trains for name in ROW_PARALLEL),
            sp_replicated=sum(spec.numel for spec in inventory
                              if spec.trainable and spec.layer == i and spec.tp_split_dim is None),
        ))
    before_decoder = any(spec.trainable for spec in inventory if spec.component in ("encoder", "adapter", "embedding"))
    return StepShape(
        micro_batch=cfg.optim.micro_batch_size, seq_length=cfg.data.seq_length, hidden=dec.hidden_size,
        kv_width=dec.num_query_groups * dec.kv_channels, lora_rank=cfg.lora.rank, tp=parallel.tp,
        pp=parallel.pp, cp=parallel.cp, dp=dp, vpp=parallel.vpp or 1, sp=parallel.sp,
        distributed_optimizer=parallel.distributed_optimizer, tie_embeddings=dec.tie_embeddings,
        padded_vocab=padded_vocab_size(dec.vocab_size, parallel.tp), num_microbatches=num_microbatches,
        activation_bytes=2 if cfg.launcher.accelerator == "gpu" else 4, layers=tuple(layers),
        full_recompute_layers=frozenset(full_recompute_layers),
        final_norm_trains="language_model.decoder.final_layernorm.weight" in trains,
        embedding_trains="language_model.embedding.word_embeddings.weight" in trains,
        gradients_reach_embedding_output=before_decoder,
    )


def stage_traffic(shape: StepShape, trainable_per_stage: list[int], widths=None) -> list[Traffic]:
    """Per pipeline stage, the payload bytes one of its ranks hands to collectives in a
    step; `trainable_per_stage`: trainable parameters per rank of each stage
    (estimate.stage_params); `widths`: the token width of each micro-batch's rows as the
    model runs them (default: data.seq_length, as the plan assumes every row full)."""
    s = shape
    widths = [s.seq_length] * s.num_microbatches if widths is None else list(widths)
    tokens = sum(s.micro_batch * w / s.cp for w in widths)  # positions on one CP rank, all micro-batches
    act = tokens * s.hidden * s.activation_bytes  # A summed over the micro-batches, in bytes
    lora = tokens * s.lora_rank * s.activation_bytes  # a LoRA factor's activations
    kv = tokens * s.cp * (s.kv_width / s.tp) * s.activation_bytes  # K or V, gathered over CP
    v = s.vpp
    stages = []
    for stage in range(s.pp):
        t = Traffic(stage=stage)
        first, last = stage == 0, stage == s.pp - 1
        mine = [i for i in range(len(s.layers)) if _stage_of(i, s) == stage]
        layers = [s.layers[i] for i in mine]
        recomputed = [s.layers[i] for i in mine if i in s.full_recompute_layers]
        if s.tp > 1:
            n, r = len(layers), len(recomputed)
            if s.sp:
                # forward: 2 input gathers; backward: 2 output-gradient gathers + weight-gradient re-gathers
                gathers = act * (4 * n + sum(x.column_weights for x in layers) + 2 * r)
                scatters = act * (4 * n + 2 * r)
                # LoRA: the column factor's output gathered forward (its gradient scattered
                # backward), the row factor's scattered forward (gathered backward)
                gathers += lora * sum(x.column_lora + x.row_lora for x in layers)
                gathers += lora * sum(x.column_lora for x in recomputed)
                scatters += lora * sum(x.column_lora + x.row_lora for x in layers)
                scatters += lora * sum(x.row_lora for x in recomputed)
                t.add("tp", "all_gather", gathers)
                t.add("tp", "reduce_scatter", scatters)
                replicated = sum(x.sp_replicated for x in layers) + (s.hidden if last and s.final_norm_trains else 0)
                t.add("tp", "all_reduce", replicated * 4)  # their fp32 gradients, once a step
            else:
                reduces = act * (4 * n + 2 * r)
                reduces += lora * sum(x.column_lora + x.row_lora for x in layers)  # column backward, row forward
                reduces += lora * sum(x.row_lora for x in recomputed)
                t.add("tp", "all_reduce", reduces)
            if first:
                t.add("tp", "all_reduce", act)  # vocabulary-parallel embedding
                if s.sp and s.gradients_reach_embedding_output:
                    t.add("tp", "all_gather", act)  # backward of the scatter to sequence shards
            if last:
                # vocabulary-parallel cross entropy: the logits' max, the target logit and
                # the sum of exponentials, fp32 per position
                t.add("tp", "all_reduce", 3 * tokens * 4)
                if s.sp:
                    regather = 1 if (s.embedding_trains if s.tie_embeddings else True) else 0
                    t.add("tp", "all_gather", act * (1 + regather))
                    t.add("tp", "reduce_scatter", act)
                else:
                    t.add("tp", "all_reduce", act)
        if s.cp > 1:
            t.add("cp", "all_gather", kv * 2 * (len(layers) + len(recomputed)))
            t.add("cp", "reduce_scatter", kv * 2 * len(layers))
        if s.pp > 1:
            chunks_sending = (v - (1 if last else 0)) + (v - (1 if first else 0))  # forward + backward
            t.add("pp", "send", act / (s.tp if s.sp else 1) * chunks_sending)
            if s.tie_embeddings and s.embedding_trains and (first or last):
                t.add("pp", "all_reduce", s.padded_vocab / s.tp * s.hidden * 4)
        if s.dp * s.cp > 1:
            grads = trainable_per_stage[stage] * 4
            if s.distributed_optimizer:
                t.add("dp", "reduce_scatter", grads)
                t.add("dp", "all_gather", trainable_per_stage[stage] * s.activation_bytes)
            else:
                t.add("dp", "all_reduce", grads)
        stages.append(t)
    return stages


def _stage_of(layer: int, s: StepShape) -> int:
    """The pipeline rank holding decoder `layer`: megatron splits the layers evenly over
    pp x vpp model chunks and deals the chunks to the ranks in turn."""
    chunks = s.pp * s.vpp
    chunk = layer // (len(s.layers) // chunks)
    return chunk % s.pp
