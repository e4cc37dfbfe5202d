"""Rules of the parallel layout: sizes, world size, heads and layers per rank, sequence
length against CP and TP, batch sizes, the run's layout against its latest checkpoint,
recompute and the distributed optimizer."""

from __future__ import annotations

from typing import Iterator

from orchestrator.plan.checkpoint_dirs import layout_text
from orchestrator.plan.schema import (
    DataConfig,
    LauncherConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
)
from orchestrator.plan.parallel_dims import ParallelDims, canonical_nodes_problem, world_size as launcher_world
from orchestrator.plan.topology import RANK_ORDERS
from orchestrator.plan.rules.findings import Finding, error, one_of, positive, warning


def world_size(launcher: LauncherConfig) -> int:
    return launcher_world(launcher.nodes, launcher.gpus_per_node)


def model_parallel_size(parallel: ParallelConfig) -> int:
    return parallel.tp * parallel.pp * parallel.cp


def parallel_dims(parallel: ParallelConfig, launcher: LauncherConfig) -> ParallelDims:
    """The run's sizes; dp None where tp x pp x cp does not tile the launcher's ranks
    (check_world_size says so)."""
    dims = ParallelDims.of(parallel)
    world = world_size(launcher)
    return dims if ParallelDims.world_problem(dims.tp, dims.pp, dims.cp, world, "") else dims.at_world(world)


def check_sizes(parallel: ParallelConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    yield from positive(
        "sizes",
        **{
            "parallel.tp": parallel.tp,
            "parallel.pp": parallel.pp,
            "parallel.cp": parallel.cp,
            "launcher.nodes": launcher.nodes,
            "launcher.gpus_per_node": launcher.gpus_per_node,
        },
    )
    if parallel.vpp is not None and parallel.vpp < 1:
        yield error("sizes", f"parallel.vpp={parallel.vpp} must be a positive integer or null")


def check_world_size(parallel: ParallelConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    world, mp = world_size(launcher), model_parallel_size(parallel)
    if world < 1 or mp < 1:
        return
    problem = ParallelDims.world_problem(
        parallel.tp, parallel.pp, parallel.cp, world,
        f"launcher.nodes {launcher.nodes} x launcher.gpus_per_node {launcher.gpus_per_node}")
    if problem:
        yield error("world_size", problem)


def check_rank_order(parallel: ParallelConfig) -> Iterator[Finding]:
    yield from one_of("rank_order", "parallel.rank_order", parallel.rank_order, RANK_ORDERS)


def check_heads(parallel: ParallelConfig, model: ModelConfig) -> Iterator[Finding]:
    dec, tp = model.decoder, parallel.tp
    if tp < 1:
        return
    if dec.num_attention_heads % tp:
        yield error(
            "heads_tp",
            f"model.decoder.num_attention_heads ({dec.num_attention_heads}) is not divisible by parallel.tp ({tp}); "
            f"use a tp that divides {dec.num_attention_heads}",
        )
    if dec.num_query_groups % tp:
        yield error(
            "kv_heads_tp",
            f"model.decoder.num_query_groups ({dec.num_query_groups} KV heads) is not divisible by parallel.tp ({tp}); "
            f"use a tp that divides {dec.num_query_groups}",
        )
    if dec.num_query_groups < 1 or dec.num_attention_heads % max(dec.num_query_groups, 1):
        yield error(
            "gqa",
            f"model.decoder.num_attention_heads ({dec.num_attention_heads}) is not a multiple of "
            f"model.decoder.num_query_groups ({dec.num_query_groups})",
        )


def check_layers(parallel: ParallelConfig, model: ModelConfig) -> Iterator[Finding]:
    layers, pp, vpp = model.decoder.num_layers, parallel.pp, parallel.vpp
    if pp < 1:
        return
    if layers % pp:
        yield error(
            "layers_pp",
            f"model.decoder.num_layers ({layers}) is not divisible by parallel.pp ({pp}); "
            f"use a pp that divides {layers}",
        )
    if vpp is not None and vpp >= 1:
        if pp == 1:
            yield error("vpp_needs_pp", f"parallel.vpp ({vpp}) needs parallel.pp > 1 (pp is {pp}); set parallel.vpp=null")
        elif layers % (pp * vpp):
            yield error(
                "layers_vpp",
                f"model.decoder.num_layers ({layers}) is not divisible by parallel.pp ({pp}) x parallel.vpp ({vpp}) "
                f"= {pp * vpp}; each virtual stage needs the same number of layers",
            )


def check_sequence(parallel: ParallelConfig, data: DataConfig, model: ModelConfig) -> Iterator[Finding]:
    seq, cp, tp = data.seq_length, parallel.cp, parallel.tp
    if seq < 1:
        yield error("seq_length", f"data.seq_length={seq} must be positive")
        return
    if cp > 1 and seq % (2 * cp):
        yield error(
            "seq_cp",
            f"data.seq_length ({seq}) is not divisible by 2 x parallel.cp ({cp}) = {2 * cp}: context parallel "
            f"splits each sequence into 2*cp load-balanced chunks; use a multiple of {2 * cp}",
        )
    if parallel.sp and tp > 1 and seq % tp:
        yield error(
            "seq_sp",
            f"data.seq_length ({seq}) is not divisible by parallel.tp ({tp}) with parallel.sp=true: sequence "
            f"parallel splits the sequence over TP ranks; use a multiple of {tp}",
        )
    if seq > model.decoder.max_position_embeddings:
        yield error(
            "seq_positions",
            f"data.seq_length ({seq}) exceeds model.decoder.max_position_embeddings "
            f"({model.decoder.max_position_embeddings})",
        )


def check_sequence_parallel(parallel: ParallelConfig) -> Iterator[Finding]:
    if parallel.sp and parallel.tp <= 1:
        yield error(
            "sp_needs_tp",
            f"parallel.sp=true needs parallel.tp > 1 (tp is {parallel.tp}); set parallel.sp=false or raise tp",
        )


def check_context_parallel(parallel: ParallelConfig, data: DataConfig) -> Iterator[Finding]:
    """Context parallelism splits every row into 2*cp chunks (orchestrator.data.context_parallel);
    with sequence parallelism each rank's share is split again over the TP ranks."""
    cp, tp, seq = parallel.cp, parallel.tp, data.seq_length
    if cp > 1 and parallel.sp and seq % (2 * cp * tp):
        yield error(
            "seq_cp_sp",
            f"data.seq_length ({seq}) is not divisible by 2 x parallel.cp ({cp}) x parallel.tp ({tp}) = "
            f"{2 * cp * tp} with parallel.sp=true: each context-parallel rank holds 2 chunks of every row and "
            f"sequence parallel splits those over the TP ranks; use a multiple of {2 * cp * tp}",
        )


def check_batch(parallel: ParallelConfig, launcher: LauncherConfig, optim: OptimConfig) -> Iterator[Finding]:
    yield from positive(
        "batch", **{"optim.global_batch_size": optim.global_batch_size, "optim.micro_batch_size": optim.micro_batch_size}
    )
    world, mp = world_size(launcher), model_parallel_size(parallel)
    if world < 1 or mp < 1 or world % mp or optim.micro_batch_size < 1 or optim.global_batch_size < 1:
        return
    dims = parallel_dims(parallel, launcher)
    dp = dims.dp
    problem = dims.batch_problem(optim.global_batch_size, optim.micro_batch_size)
    if problem:
        yield error("global_batch", problem)
        return
    microbatches = dims.microbatches(optim.global_batch_size, optim.micro_batch_size)
    if parallel.pp > 1 and microbatches < parallel.pp:
        yield warning(
            "pipeline_bubble",
            f"{microbatches} micro-batches per step (optim.global_batch_size {optim.global_batch_size} / "
            f"(optim.micro_batch_size {optim.micro_batch_size} x DP {dp})) is fewer than parallel.pp ({parallel.pp}): "
            f"the pipeline idles most of each step; raise the global batch or lower the micro batch",
        )
    if parallel.vpp and parallel.pp > 1 and microbatches % parallel.pp:
        yield error(
            "vpp_microbatches",
            f"the interleaved schedule (parallel.vpp={parallel.vpp}) needs the number of micro-batches "
            f"({microbatches}) to be a multiple of parallel.pp ({parallel.pp})",
        )


def layout_change(saved: dict, plan: dict) -> tuple[str | None, list]:
    """(a line saying how this plan's layout differs from the checkpoint's, or None when
    it does not; the reasons it cannot continue there). `plan`: the resolved plan."""
    now = {k: plan[k] for k in ("tp", "pp", "cp", "dp")}
    before = {k: saved.get(k) for k in now}
    if before == now:
        return None, []
    errors = []
    nodes = saved.get("canonical_nodes")
    configured = plan["config"]["data"].get("canonical_nodes")
    if nodes:
        problem = canonical_nodes_problem(nodes, now["dp"], fixed=True, configured=configured)
        if problem:
            errors.append(problem)
    if saved.get("optimizer") == "dp_reshardable" and any(before[k] != now[k] for k in ("tp", "pp", "cp")):
        errors.append(f"the checkpoint's distributed-optimizer state (megatron's dp_reshardable layout) loads at "
                      f"another data-parallel size only: keep TP {before['tp']} PP {before['pp']} CP {before['cp']} "
                      f"(runs without parallel.distributed_optimizer also change TP, PP and CP)")
    share = f"; each data-parallel rank reads {nodes // now['dp']} of its {nodes} canonical nodes" \
        if nodes and not errors else ""
    return f"continues at another size: {layout_text(before)} -> {layout_text(now)}{share}", errors


def check_canonical_nodes(parallel: ParallelConfig, launcher: LauncherConfig, data: DataConfig,
                          optim: OptimConfig) -> Iterator[Finding]:
    nodes = data.canonical_nodes
    if nodes is None:
        return
    world, mp = world_size(launcher), model_parallel_size(parallel)
    if nodes < 1 or world < 1 or mp < 1 or world % mp:
        yield from positive("canonical_nodes", **{"data.canonical_nodes": nodes})
        return
    problem = canonical_nodes_problem(nodes, world // mp, fixed=False)
    if problem:
        yield error("canonical_nodes", problem)
    elif optim.micro_batch_size > 0 and optim.global_batch_size % (optim.micro_batch_size * nodes):
        yield warning("canonical_nodes",
                      f"optim.global_batch_size ({optim.global_batch_size}) is not a multiple of "
                      f"optim.micro_batch_size ({optim.micro_batch_size}) x data.canonical_nodes ({nodes}): "
                      f"a run continued at another data-parallel size reads every sample once, but its steps "
                      f"group the micro-batches differently from a run at the first size")


def check_recompute(parallel: ParallelConfig, model: ModelConfig) -> Iterator[Finding]:
    rc = parallel.recompute
    yield from one_of("recompute", "parallel.recompute.granularity", rc.granularity, (None, "full", "selective"))
    if rc.granularity == "full":
        yield from one_of("recompute", "parallel.recompute.method", rc.method, ("uniform", "block"))
        if rc.num_layers is None or rc.num_layers < 1:
            yield error(
                "recompute",
                f"parallel.recompute.granularity=full needs parallel.recompute.num_layers >= 1 (got {rc.num_layers})",
            )
        elif parallel.pp >= 1:
            per_stage = model.decoder.num_layers // max(parallel.pp * (parallel.vpp or 1), 1)
            if rc.num_layers > per_stage:
                yield error(
                    "recompute",
                    f"parallel.recompute.num_layers ({rc.num_layers}) exceeds the {per_stage} decoder layers per "
                    f"pipeline stage (model.decoder.num_layers {model.decoder.num_layers} / parallel.pp {parallel.pp}"
                    f"{' / parallel.vpp ' + str(parallel.vpp) if parallel.vpp else ''})",
                )
    elif rc.granularity == "selective":
        if rc.method is not None or rc.num_layers is not None:
            yield error(
                "recompute",
                f"parallel.recompute.granularity=selective takes no method/num_layers (got method={rc.method}, "
                f"num_layers={rc.num_layers}); set them to null",
            )
    elif rc.method is not None or rc.num_layers is not None:
        yield error(
            "recompute",
            f"parallel.recompute.method={rc.method} / num_layers={rc.num_layers} are set but "
            f"parallel.recompute.granularity is null; set granularity=full or clear them",
        )


def check_distributed_optimizer(parallel: ParallelConfig, launcher: LauncherConfig) -> Iterator[Finding]:
    # megatron shards the optimizer state over the data x context parallel ranks.
    mp = model_parallel_size(parallel)
    if parallel.distributed_optimizer and mp >= 1 and world_size(launcher) // mp * parallel.cp == 1:
        yield warning(
            "distributed_optimizer",
            "parallel.distributed_optimizer=true with data-parallel size 1 (and parallel.cp=1) shards nothing",
        )
