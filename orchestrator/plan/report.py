"""The human-readable summary printed by `audiollm plan`."""

from __future__ import annotations

import math

from orchestrator.plan.parallel_dims import world_size
from orchestrator.plan.resolved import Plan

MAX_GROUPS_SHOWN = 8


def _count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


def _groups(groups: list[list[int]]) -> str:
    shown = ", ".join(str(g) for g in groups[:MAX_GROUPS_SHOWN])
    more = f", ... ({len(groups)} groups)" if len(groups) > MAX_GROUPS_SHOWN else ""
    return shown + more


def largest_term(memory: dict) -> str:
    """The largest of an estimate's weights, grads, optimizer and activations, with its size."""
    name = max(("weights", "grads", "optimizer", "activations"), key=lambda k: memory[f"{k}_gib"])
    return f"{name} {memory[f'{name}_gib']:.1f} GiB"


def render(plan: Plan, with_params: bool = False) -> str:
    cfg = plan.config
    launcher, parallel, optim = cfg["launcher"], cfg["parallel"], cfg["optim"]
    mem, flops = plan.memory, plan.flops
    dims, world = plan.dims, world_size(launcher["nodes"], launcher["gpus_per_node"])  # (they differ in a plan with errors)
    lines = [
        f"recipe        {plan.recipe}   model {cfg['model']['name']} (backend {cfg['model']['backend']}, attention "
        f"{plan.model_extensions['attention_kernel']}, encoder {plan.model_extensions['encoder_precision']}, "
        f"compiled {plan.model_extensions['compiled']})",
        f"topology      world {world} = nodes {launcher['nodes']} x gpus_per_node {launcher['gpus_per_node']}"
        f" ({launcher['accelerator']}) = TP {dims.tp} x PP {dims.pp} x CP {dims.cp} x DP {dims.dp}",
        f"              VPP {dims.vpp or '-'}, sequence parallel {'on' if dims.sp else 'off'}, distributed optimizer "
        f"{'on' if parallel['distributed_optimizer'] else 'off'}, recompute {parallel['recompute']['granularity'] or 'none'}"
        f"{'/' + str(parallel['recompute']['method']) if parallel['recompute']['method'] else ''}"
        f"{' x' + str(parallel['recompute']['num_layers']) if parallel['recompute']['num_layers'] else ''}",
        f"batch         global {optim['global_batch_size']} = micro {optim['micro_batch_size']} x DP {dims.dp} x "
        f"{plan.num_microbatches} micro-batches; seq {cfg['data']['seq_length']}; {plan.tokens_per_step} tokens/step",
        f"vocab         {cfg['model']['decoder']['vocab_size']} -> padded {plan.padded_vocab_size} (multiple of 128 x TP {dims.tp})",
        "rank layout   (" + parallel["rank_order"] + ")",
    ]
    for kind in ("tp", "pp", "dp", "cp"):
        lines.append(f"  {kind.upper()} groups  {_groups(plan.rank_layout[kind])}")
    lines.append("parameters    " + ", ".join(
        f"{component} {_count(v['trainable'] + v['frozen'])} ({_count(v['trainable'])} trainable)"
        for component, v in plan.parameters["total"].items()
    ))
    for stage in plan.parameters["per_rank_by_stage"]:
        lines.append(
            f"  per rank, stage {stage['stage']}: {_count(stage['total'])} ({_count(stage['trainable'])} trainable, "
            f"{_count(stage['frozen'])} frozen)"
        )
    device = "unbounded (CPU)" if math.isinf(mem["device_gib"]) else f"{mem['device_gib']:.1f} GiB"
    verdict = "fits" if mem["fits"] else f"DOES NOT FIT (largest: {largest_term(mem)})"
    lines.append(
        f"memory/GPU    {mem['total_gib']:.1f} GiB on stage {mem['stage']} = weights {mem['weights_gib']:.1f} + grads "
        f"{mem['grads_gib']:.1f} + optimizer {mem['optimizer_gib']:.1f} + activations {mem['activations_gib']:.1f} + "
        f"margin {mem['overhead_gib']:.1f}; device {device}: {verdict}"
    )
    at_cp1 = plan.memory_at_cp1
    if at_cp1 is not None:
        lines.append(
            f"  at CP=1       {at_cp1['total_gib']:.1f} GiB on stage {at_cp1['stage']} (same GPUs, DP {dims.dp * dims.cp}) = "
            f"weights {at_cp1['weights_gib']:.1f} + grads {at_cp1['grads_gib']:.1f} + optimizer "
            f"{at_cp1['optimizer_gib']:.1f} + activations {at_cp1['activations_gib']:.1f} + margin "
            f"{at_cp1['overhead_gib']:.1f}: {'fits' if at_cp1['fits'] else 'DOES NOT FIT'}"
        )
    lines.append(f"FLOPs/step    model {_flop(flops['model_flops_per_step'])}, hardware (with recompute) "
                 f"{_flop(flops['hardware_flops_per_step'])}")
    step = plan.step_estimate
    if step is not None:
        sent = ", ".join(f"{kind.upper()} {gb:.1f} GB" + (" (between nodes)" if step["crosses_nodes"][kind] else "")
                         for kind, gb in step["wire_gb"].items() if gb)
        lines.append(f"step estimate {step['step_s']:.2f} s/step, {step['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, "
                     f"pipeline bubble {step['bubble']:.0%}; each GPU sends per step: {sent or 'nothing'}")
        lines.append("  rests on: " + "; ".join(step["inputs"]))
    lines.append("megatron argv")
    lines.append("  " + " ".join(plan.argv))
    own = plan.model_extensions["implemented_by_audiollm"]
    if own:
        lines.append("  implemented by audiollm's own modules, not by megatron-core: " + "; ".join(
            f"{flags} ({where})" for flags, where in own.items()))
    for name, rule in plan.model_extensions["decided_at_start"].items():
        lines.append(f"  decided by the job at start: {name} ({rule})")
    for warning in plan.warnings:
        lines.append(warning)
    if with_params:
        from omegaconf import OmegaConf

        from orchestrator.plan.model_params import parameter_inventory
        from orchestrator.plan.schema import AudioLLMConfig

        obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AudioLLMConfig), cfg))
        lines.append("parameters (name, full shape, trainable)")
        for spec in parameter_inventory(obj.model, obj.lora, dims.tp):
            lines.append(f"  {spec.name} {list(spec.shape)} {'trainable' if spec.trainable else 'frozen'}")
    return "\n".join(lines)


def _flop(value: float) -> str:
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value / 1e6:.2f} MFLOP"
