"""One layout's communication, pipeline bubble and step time on GPUs: the plan's
`step_estimate` (`audiollm plan`, and a row of `audiollm plan -m`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.plan import communication as comm
from orchestrator.plan import estimate as est
from orchestrator.plan import step_time
from orchestrator.plan.megatron_args import padded_vocab_size
from orchestrator.plan.step_flops import StepFlops, recomputed_layers
from orchestrator.plan.topology import rank_layout

ENCODER_SIDE = ("mel_frame", "enc_position", "enc_pair", "audio_token")


@dataclass
class LayoutEstimate:
    step_s: float
    tokens_per_s_per_gpu: float
    bubble: float  # share of the step a GPU idles in the pipeline's fill and drain
    mfu: float  # the efficiency the compute time assumes
    mfu_measured_here: bool  # measured on this GPU type (else borrowed from another)
    wire_gb: dict  # kind -> GB one GPU of the busiest stage sends per step (ring factors applied)
    payload_gb: dict  # kind -> GB handed to collectives (communication.py's count)
    crosses_nodes: dict  # kind -> whether its groups span nodes (then the network's speed applies)
    # Hardware TFLOPs one GPU of the busiest stage computes per step (recompute included; a
    # pipeline's first stage also runs the encoder, its last the output layer).
    busiest_gpu_tflop: float = 0.0
    inputs: list = field(default_factory=list)  # what the estimate rests on, measured or assumed


def chunk_flops_per_microbatch(cfg, inventory) -> tuple[list[list[float]], list[list[float]]]:
    """Hardware FLOPs of one micro-batch on one GPU, forward and backward (recompute
    included), per pipeline stage and model chunk. The decoder's layers split evenly over
    the stages' chunks and over TP x CP; the output layer sits on the last chunk of the
    last stage; the Whisper encoder and the adapter on the first chunk of the first,
    replicated over TP (every TP rank encodes every clip of its rows) and split over CP (a
    rank encodes the clips of its chunks, estimate.clips_per_row)."""
    model, parallel = cfg.model, cfg.parallel
    vocab = padded_vocab_size(model.decoder.vocab_size, parallel.tp)
    trained = [p.name for p in inventory if p.trainable]
    counter = StepFlops(model, cfg.lora.rank, parallel.recompute, vocab, trained, pp=parallel.pp, vpp=parallel.vpp)
    share = cfg.optim.micro_batch_size / cfg.optim.global_batch_size
    items = {kind: n * share for kind, n in est.planned_step_items(cfg).items()}

    def forward_backward(kinds) -> tuple[float, float]:
        forward = sum(items.get(k, 0) * counter.coefficients[k][0] for k in kinds)
        backward = sum(items.get(k, 0) * (counter.coefficients[k][1] + counter.coefficients[k][2]) for k in kinds)
        return forward, backward

    per_rank = est.clips_per_row(cfg) / max(est.clips_in_a_row(cfg), 1)
    encoder_f, encoder_b = (per_rank * x for x in forward_backward([k for k in counter.coefficients if k in ENCODER_SIDE]))
    decoder_f, decoder_b = forward_backward([k for k in counter.coefficients if k not in ENCODER_SIDE])
    output_weight = ("language_model.embedding.word_embeddings.weight" if model.decoder.tie_embeddings
                     else "language_model.output_layer.weight")
    output_f = items["token"] * 2.0 * model.decoder.hidden_size * vocab
    output_b = output_f * (1 + int(output_weight in trained))  # the input gradient, the weight's where it trains
    split, chunks = parallel.tp * parallel.cp, parallel.pp * (parallel.vpp or 1)
    layers_f, layers_b = max(decoder_f - output_f, 0.0) / chunks / split, max(decoder_b - output_b, 0.0) / chunks / split
    forward = [[layers_f] * (parallel.vpp or 1) for _ in range(parallel.pp)]
    backward = [[layers_b] * (parallel.vpp or 1) for _ in range(parallel.pp)]
    forward[0][0] += encoder_f
    backward[0][0] += encoder_b
    forward[-1][-1] += output_f / split
    backward[-1][-1] += output_b / split
    return forward, backward


def estimate_layout(cfg, inventory, stages, dp: int, num_microbatches: int,
                    overlap_grad_reduce: bool) -> LayoutEstimate:
    """The step of a validated AudioLLMConfig on GPUs (resolve.py: `inventory` and `stages`
    as estimate.inventory_for and stage_params give them)."""
    parallel, launcher = cfg.parallel, cfg.launcher
    rc = parallel.recompute
    full = recomputed_layers(cfg.model.decoder.num_layers, rc.granularity, rc.method, rc.num_layers,
                             parallel.pp, parallel.vpp)
    m = num_microbatches
    traffic = comm.stage_traffic(comm.shape_of(cfg, dp, m, inventory, full), [s.trainable for s in stages])
    layout = rank_layout(parallel.tp, parallel.cp, dp, parallel.pp, parallel.rank_order)
    per_node = launcher.gpus_per_node
    groups = {"tp": layout.tp, "cp": layout.cp, "pp": layout.pp, "dp": _dp_cp_groups(layout)}
    link, link_notes = step_time.links(launcher)
    crosses = {kind: step_time.group_spans_nodes(g, per_node) for kind, g in groups.items()}
    bandwidth = {kind: link.inter_node_gb_s if crosses[kind] else link.intra_node_gb_s for kind in groups}
    sizes = {"tp": parallel.tp, "cp": parallel.cp, "pp": parallel.pp, "dp": dp * parallel.cp}
    device = est.DEVICES[launcher.gpu_type]
    efficiency = step_time.efficiency(launcher.gpu_type)
    forward, backward = chunk_flops_per_microbatch(cfg, inventory)
    timing = step_time.estimate(
        forward, backward, traffic, num_microbatches=m, vpp=parallel.vpp,
        group_sizes=sizes, bandwidths=bandwidth, peak_flops=device.peak_tflops * 1e12, mfu=efficiency.mfu,
        world=launcher.nodes * launcher.gpus_per_node, tokens=cfg.optim.global_batch_size * cfg.data.seq_length,
        overlap_grad_reduce=overlap_grad_reduce)
    busiest = max(traffic, key=lambda t: t.total())
    wire = {kind: busiest.wire_bytes(kind, sizes) / 1e9 for kind in comm.KINDS}
    return LayoutEstimate(
        step_s=timing.step_s, tokens_per_s_per_gpu=timing.tokens_per_s_per_gpu, bubble=timing.bubble,
        mfu=efficiency.mfu, mfu_measured_here=efficiency.measured_here,
        wire_gb=wire, payload_gb={kind: busiest.payload(kind) / 1e9 for kind in comm.KINDS}, crosses_nodes=crosses,
        busiest_gpu_tflop=max(sum(f) + sum(b) for f, b in zip(forward, backward)) * m / 1e12,
        inputs=[f"compute: {efficiency.source}", *link_notes,
                             "bubble: megatron's schedule played with each stage's own times"])


def _dp_cp_groups(layout) -> list[list[int]]:
    """The groups gradients are reduced over: the DP x CP ranks of one (TP rank, pipeline
    stage), i.e. the DP groups when CP = 1."""
    tp_rank = {r: i for group in layout.tp for i, r in enumerate(group)}
    stage = {r: i for group in layout.pp for i, r in enumerate(group)}
    groups: dict = {}
    for rank in sorted(tp_rank):
        groups.setdefault((tp_rank[rank], stage[rank]), []).append(rank)
    return sorted(groups.values())
