"""Rules of LoRA and the learning-rate groups, the groups checked against the names of the
model's own parameters (orchestrator/plan/model_params.py)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterator

from orchestrator.plan.schema import (
    LoraConfig,
    ModelConfig,
)
from orchestrator.plan.rules.findings import Finding, error


# Decoder linears that can carry LoRA adapters (megatron-core module names).
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def check_lora(lora: LoraConfig, model: ModelConfig) -> Iterator[Finding]:
    if lora.rank < 0:
        yield error("lora", f"lora.rank={lora.rank} must be >= 0 (0 disables LoRA)")
    if lora.rank == 0:
        return
    unknown = [t for t in lora.targets if t not in LORA_TARGETS]
    if unknown:
        yield error(
            "lora_targets",
            f"lora.targets {unknown} do not exist in model {model.name}; decoder linears are {list(LORA_TARGETS)}",
        )
    if not lora.targets:
        yield error("lora_targets", f"lora.rank={lora.rank} but lora.targets is empty")
    smallest = min(model.decoder.hidden_size, model.decoder.kv_channels * model.decoder.num_query_groups)
    if lora.rank > smallest:
        yield error(
            "lora_rank",
            f"lora.rank ({lora.rank}) exceeds the smallest adapted dimension ({smallest}) of model {model.name}",
        )
    if lora.alpha <= 0:
        yield error("lora", f"lora.alpha={lora.alpha} must be positive")
    if not 0.0 <= lora.dropout < 1.0:
        yield error("lora", f"lora.dropout={lora.dropout} must be in [0, 1)")


def check_lr_group_fields(lora: LoraConfig) -> Iterator[Finding]:
    if not lora.lr_groups:
        yield error("lr_groups", "lora.lr_groups is empty; add at least {name: all, patterns: ['*'], lr_scale: 1.0}")
    names = [g.name for g in lora.lr_groups]
    for name in sorted({n for n in names if names.count(n) > 1}):
        yield error("lr_groups", f"lora.lr_groups has two groups named {name!r}")
    for group in lora.lr_groups:
        if group.lr_scale < 0:
            yield error("lr_groups", f"lora.lr_groups[{group.name}].lr_scale={group.lr_scale} must be >= 0")
        if not group.patterns:
            yield error("lr_groups", f"lora.lr_groups[{group.name}] has no patterns")


@dataclass(frozen=True)
class NamedParam:
    """What lr-group rules need to know of a parameter (from model_params)."""

    name: str
    frozen: bool  # frozen by the model config (encoder.freeze, adapter.freeze, LoRA base weights)


def check_lr_groups_against_params(lora: LoraConfig, params: list[NamedParam], model_name: str) -> Iterator[Finding]:
    """Every pattern matches something; every trainable parameter falls in a group;
    no group with a non-zero rate holds only frozen parameters."""
    for group in lora.lr_groups:
        for pattern in group.patterns:
            if not any(fnmatch.fnmatchcase(p.name, pattern) for p in params):
                yield error(
                    "lr_group_pattern",
                    f"lora.lr_groups[{group.name}] pattern {pattern!r} matches no parameter of model {model_name} "
                    f"(names look like {params[0].name if params else '?'}); see `audiollm plan --params`",
                )
    members: dict[str, list[NamedParam]] = {g.name: [] for g in lora.lr_groups}
    unmatched = []
    for param in params:
        group = next((g for g in lora.lr_groups if any(fnmatch.fnmatchcase(param.name, p) for p in g.patterns)), None)
        if group is None:
            if not param.frozen:
                unmatched.append(param.name)
        else:
            members[group.name].append(param)
    if unmatched:
        shown = ", ".join(unmatched[:5]) + (f" and {len(unmatched) - 5} more" if len(unmatched) > 5 else "")
        yield error(
            "lr_group_unmatched",
            f"{len(unmatched)} trainable parameter(s) match no lora.lr_groups entry: {shown}; "
            f"add a group (for example {{name: rest, patterns: ['*'], lr_scale: 1.0}}) — there is no default rate",
        )
    for group in lora.lr_groups:
        in_group = members[group.name]
        if group.lr_scale > 0 and in_group and all(p.frozen for p in in_group):
            yield error(
                "lr_frozen",
                f"lora.lr_groups[{group.name}] has lr_scale {group.lr_scale} but all its {len(in_group)} parameters "
                f"are frozen by the model config (e.g. {in_group[0].name}); set its lr_scale to 0 or unfreeze "
                f"the module (model.encoder.freeze / model.adapter.freeze / model.decoder.freeze)",
            )


def named_params(model: ModelConfig, lora: LoraConfig, tp: int) -> list[NamedParam]:
    from orchestrator.plan.model_params import parameter_inventory

    # At the plan's TP (names do not depend on it): the estimate then reuses this inventory.
    return [NamedParam(p.name, not p.trainable) for p in parameter_inventory(model, lora, max(tp, 1))]
