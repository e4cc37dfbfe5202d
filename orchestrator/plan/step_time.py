"""Step time of a planned layout, from what it rests on: FLOPs at a measured efficiency,
collective bytes at link speeds, and the pipeline schedule's bubble.

- Compute: each pipeline stage's hardware FLOPs per micro-batch (the step's, split as
  the model is: encoder and adapter on the first stage, the output layer on the last,
  decoder layers where megatron puts them) at the GPU's bf16 peak times an efficiency
  MEASURED on a real GPU by benchmarks/gpu_acceptance.py (its whole-step throughput:
  optimizer, data and host overheads included). A GPU type without its own measurement
  borrows another's, and the estimate says so.
- Communication: communication.py's bytes per collective, times the ring factor, over
  the bandwidth of the slowest link the group spans (NVLink inside a node, the network
  between nodes; `launcher.intra_node_gb_s` / `launcher.inter_node_gb_s` override the
  GPU type's defaults). Without TransformerEngine nothing overlaps tensor- and context-
  parallel collectives with compute, so they add to every micro-batch; pipeline sends
  add to it too. The data-parallel gradient reduction overlaps the last micro-batch's
  backward when the plan turns overlap_grad_reduce on; the distributed optimizer's
  parameter all-gather does not overlap.
- Bubble: megatron's schedule (orchestrator/plan/schedule.py: 1F1B, or interleaved over
  `vpp` model chunks) played with each stage's and chunk's own forward and backward times
  (the first stage holds the encoder and embeddings, the last the logits); with equal
  stages that is Narayanan et al. 2021's (p-1)/(v*m+p-1) of the step. The bubble is the
  share of the step the average GPU idles for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.plan.communication import Traffic
from orchestrator.plan.schedule import makespan


@dataclass(frozen=True)
class Efficiency:
    mfu: float  # model FLOPs / (peak x time), of whole steps
    source: str
    measured_here: bool  # measured on this GPU type (else borrowed)


# Whole-step MFU measured by benchmarks/gpu_acceptance.py (docs/gpu-machines.md "Third GPU
# contact"): gemma2_2b_whisper_large_v3, LoRA r16, seq 2048, 4 micro-batches of 1 row,
# compiled layers, local backend + flex attention, bf16, no TransformerEngine.
MEASURED = {
    "h200": Efficiency(0.235, "measured: 14,095 tokens/s, MFU 23.5 % on one H200 (gemma2-2b LoRA, compiled layers, "
                              "commit 861f173, benchmarks/gpu_acceptance.py)", True),
}
BORROW = "h200"


@dataclass(frozen=True)
class Links:
    intra_node_gb_s: float  # per GPU, one direction: NVLink
    inter_node_gb_s: float  # per GPU, one direction: the GPU's share of the node's network


# Nominal per-GPU figures of the usual SXM nodes: NVLink 4 (H100/H200) 450 GB/s and NVLink 3
# (A100) 300 GB/s a direction; one 400 Gb/s (NDR) or 200 Gb/s (HDR) NIC per GPU.
LINKS = {
    "h100": Links(450.0, 50.0),
    "h200": Links(450.0, 50.0),
    "a100": Links(300.0, 25.0),
}


def efficiency(gpu_type: str) -> Efficiency:
    if gpu_type in MEASURED:
        return MEASURED[gpu_type]
    borrowed = MEASURED[BORROW]
    return Efficiency(borrowed.mfu, f"assumed: no measurement on {gpu_type}; the {BORROW}'s MFU "
                                    f"{borrowed.mfu:.1%} ({borrowed.source})", False)


def links(launcher) -> tuple[Links, list[str]]:
    """The link speeds and which of them the configuration set (the others are defaults)."""
    default = LINKS.get(launcher.gpu_type, LINKS["h100"])
    intra = launcher.intra_node_gb_s or default.intra_node_gb_s
    inter = launcher.inter_node_gb_s or default.inter_node_gb_s
    notes = [f"NVLink {intra:g} GB/s per GPU" + (" (set)" if launcher.intra_node_gb_s else
                                                 f" (assumed: {launcher.gpu_type} SXM nominal)"),
             f"network {inter:g} GB/s per GPU" + (" (set)" if launcher.inter_node_gb_s else
                                                  " (assumed: one 400 Gb/s NIC per GPU)"
                                                  if inter == 50.0 else " (assumed)")]
    return Links(intra, inter), notes


def group_spans_nodes(groups: list[list[int]], gpus_per_node: int) -> bool:
    return any(len({rank // gpus_per_node for rank in group}) > 1 for group in groups)


@dataclass
class StepTime:
    step_s: float
    bubble: float  # share of the step the average GPU idles in the pipeline's fill and drain
    tokens_per_s_per_gpu: float




def estimate(forward_flops: list[list[float]], backward_flops: list[list[float]], traffic: list[Traffic], *,
             num_microbatches: int, vpp: int | None, group_sizes: dict, bandwidths: dict, peak_flops: float,
             mfu: float, world: int, tokens: int, overlap_grad_reduce: bool) -> StepTime:
    """`forward_flops` / `backward_flops`: one micro-batch's hardware FLOPs on one GPU per
    stage and model chunk (layout_estimate.chunk_flops_per_microbatch); `group_sizes` and
    `bandwidths` (GB/s) per kind (tp, cp, pp, dp)."""
    m = num_microbatches
    rate = peak_flops * mfu
    forward_s, backward_s, reduce_s, gather_s = [], [], [], []
    for stage, t in enumerate(traffic):
        # TP, CP and pipeline traffic on the critical path, shared over the stage's
        # micro-batch chunks in proportion to their compute
        comm = sum(t.wire_bytes(kind, group_sizes) / (bandwidths[kind] * 1e9) for kind in ("tp", "cp", "pp")) / m
        compute = sum(forward_flops[stage]) + sum(backward_flops[stage])
        scale = (1 + comm * rate / compute) / rate if compute else 0.0
        forward_s.append([f * scale for f in forward_flops[stage]])
        backward_s.append([b * scale for b in backward_flops[stage]])
        dp_link = bandwidths["dp"] * 1e9
        reduce_s.append(t.wire_bytes("dp", group_sizes, ("all_reduce", "reduce_scatter")) / dp_link)
        gather_s.append(t.wire_bytes("dp", group_sizes, ("all_gather",)) / dp_link)
    pipeline_s, busy = makespan(forward_s, backward_s, m, vpp)
    # the gradient reduction hides behind the last micro-batch's backward when it overlaps;
    # the distributed optimizer's parameter all-gather does not overlap
    after = [max(0.0, r - (sum(b) if overlap_grad_reduce else 0.0)) + g
             for r, g, b in zip(reduce_s, gather_s, backward_s)]
    step = pipeline_s + max(after)
    idle = pipeline_s - sum(busy) / len(busy)  # the average stage's wait in the fill and drain
    return StepTime(step_s=step, bubble=idle / step, tokens_per_s_per_gpu=tokens / step / world)
