"""Learning-rate groups from lora.lr_groups, given to megatron's optimizer.

Each group is {name, patterns (fnmatch on full parameter names), lr_scale}. Groups
are tried in order; a parameter belongs to the first group it matches. Every trainable
parameter must match a group (no silent default rate). lr_scale 0 freezes the group:
its parameters get requires_grad=False, so neither DDP nor the optimizer ever sees
them.

megatron-core 0.16.1's supported way to give parameter groups their own rate is
get_megatron_optimizer(config_overrides={ParamKey: ParamGroupOverride}): each
optimizer param group then carries max_lr / min_lr, which OptimizerParamScheduler
reads per group (warmup to max_lr, decay to min_lr). ParamKey matching merges EVERY
matching key (no first-match), so we decide membership ourselves and tag each
parameter with an attribute that a ParamKey(attr=...) selects exactly.

Config groups with the same lr_scale share one megatron param group, and each megatron
group carries lr_mult = lr_scale. The 0.16.1 scheduler does not read lr_mult (it
uses max_lr/min_lr), but megatron's optimizer load_state_dict matches saved param
groups to live ones by (wd_mult, lr_mult, is_expert_parallel, is_decoupled_lr): groups
that differ only in max_lr would be confused on resume. One lr_mult per distinct scale
keeps that key unique.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Iterable, Sequence


class LrGroupError(ValueError):
    """lora.lr_groups does not partition the trainable parameters."""


@dataclass(frozen=True)
class LrGroup:
    name: str
    patterns: tuple
    lr_scale: float

    @staticmethod
    def from_config(entry) -> "LrGroup":
        patterns = entry.get("patterns") or []
        if isinstance(patterns, str):
            patterns = [patterns]
        return LrGroup(str(entry["name"]), tuple(patterns), float(entry.get("lr_scale", 1.0)))


def plan_groups(lora_section) -> list:
    """The plan's lora.lr_groups; without any, every trainable parameter in one group at
    the base rate."""
    return lora_section.get("lr_groups") or [{"name": "default", "patterns": ["*"], "lr_scale": 1.0}]


def parse_groups(lr_groups: Sequence) -> list:
    groups = [LrGroup.from_config(g) for g in lr_groups]
    names = [g.name for g in groups]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise LrGroupError(f"lora.lr_groups has duplicate group names {dupes}: give each group its own name")
    bad = [f"{g.name} ({g.lr_scale})" for g in groups if g.lr_scale < 0]
    if bad:
        raise LrGroupError(f"lora.lr_groups lr_scale must be >= 0; got {', '.join(bad)}")
    if not groups:
        raise LrGroupError("lora.lr_groups is empty: add at least {name: all, patterns: ['*'], lr_scale: 1.0}")
    return groups


def assign_groups(named_trainable: Iterable[str], groups: Sequence[LrGroup]) -> dict:
    """{parameter name: group} by first match; raises naming every unmatched parameter."""
    assignment, unmatched = {}, []
    for name in named_trainable:
        for group in groups:
            if any(fnmatch.fnmatchcase(name, p) for p in group.patterns):
                assignment[name] = group
                break
        else:
            unmatched.append(name)
    if unmatched:
        shown = ", ".join(unmatched[:10]) + (f" and {len(unmatched) - 10} more" if len(unmatched) > 10 else "")
        raise LrGroupError(
            f"{len(unmatched)} trainable parameter(s) match no entry of lora.lr_groups "
            f"{[g.name + ':' + str(list(g.patterns)) for g in groups]}: {shown}. Add a pattern that covers "
            f"them (for example a last group {{name: rest, patterns: ['*'], lr_scale: 1.0}}) or freeze them "
            f"with lr_scale 0"
        )
    return assignment


def _attr(scale: float) -> str:
    return f"_audiollm_lr_scale_{scale!r}"


def apply_lr_groups(model_chunks: Sequence, lr_groups: Sequence, lr: float, min_lr: float) -> tuple:
    """Freeze lr_scale-0 groups, tag the rest, and return (config_overrides for
    get_megatron_optimizer, {group name: [local parameter names]}, {group name: lr_scale}).

    Call on the unwrapped model chunks, before DDP wraps them (DDP only allocates
    gradient buffers for parameters that require grad)."""
    from megatron.core.optimizer import ParamKey

    groups = parse_groups(lr_groups)
    members = {g.name: [] for g in groups}
    for chunk in model_chunks:
        named = [(n, p) for n, p in chunk.named_parameters() if p.requires_grad]
        assignment = assign_groups([n for n, _ in named], groups)
        for name, param in named:
            group = assignment[name]
            members[group.name].append(name)
            if group.lr_scale == 0.0:
                param.requires_grad_(False)
            else:
                setattr(param, _attr(group.lr_scale), True)
    scales = sorted({g.lr_scale for g in groups if g.lr_scale > 0})
    trainable = sum(1 for c in model_chunks for p in c.parameters() if p.requires_grad)
    tagged = sum(1 for c in model_chunks for p in c.parameters()
                 if p.requires_grad and sum(hasattr(p, _attr(s)) for s in scales) == 1)
    assert trainable == tagged, f"{trainable} trainable parameters but {tagged} in exactly one lr group"

    overrides = {
        ParamKey(attr=_attr(scale)): {"max_lr": lr * scale, "min_lr": min_lr * scale, "lr_mult": scale}
        for scale in scales
    }
    return overrides, members, {g.name: g.lr_scale for g in groups}


def optimizer_overrides(config, group_overrides: dict) -> dict:
    """Our group overrides plus megatron's standard ones (no weight decay on biases and
    1-D parameters), which megatron drops once any override is given."""
    from megatron.core.optimizer import get_standard_config_overrides

    merged = dict(get_standard_config_overrides(config))
    merged.update(group_overrides)
    return merged


def group_learning_rates(optimizer, scales: dict) -> dict:
    """{group name: current lr} of the trainable groups, read from the optimizer's
    param groups (megatron aligns param groups over ranks, so every one is present on
    every rank, with or without parameters there)."""
    by_scale = {}
    for group in optimizer.param_groups:
        by_scale.setdefault(group.get("lr_mult"), group["lr"])
    return {name: by_scale[scale] for name, scale in scales.items() if scale > 0}
