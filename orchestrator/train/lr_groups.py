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
parameter with a per-group attribute that a ParamKey(attr=...) selects exactly. The
override also carries `lr_group` (the group's name), which the loop logs.
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


def _attr(index: int) -> str:
    return f"_audiollm_lr_group_{index}"


def apply_lr_groups(model_chunks: Sequence, lr_groups: Sequence, lr: float, min_lr: float) -> tuple:
    """Freeze lr_scale-0 groups, tag the rest, and return (config_overrides for
    get_megatron_optimizer, {group name: [local parameter names]}).

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
                setattr(param, _attr(groups.index(group)), True)
    trainable = sum(1 for c in model_chunks for p in c.parameters() if p.requires_grad)
    tagged = sum(1 for c in model_chunks for p in c.parameters()
                 if p.requires_grad and sum(hasattr(p, _attr(i)) for i in range(len(groups))) == 1)
    assert trainable == tagged, f"{trainable} trainable parameters but {tagged} in exactly one lr group"

    overrides = {}
    for index, group in enumerate(groups):
        if group.lr_scale == 0.0:
            continue
        overrides[ParamKey(attr=_attr(index))] = {
            "max_lr": lr * group.lr_scale, "min_lr": min_lr * group.lr_scale, "lr_group": group.name,
        }
    return overrides, members


def optimizer_overrides(config, group_overrides: dict) -> dict:
    """Our group overrides plus megatron's standard ones (no weight decay on biases and
    1-D parameters), which megatron drops once any override is given."""
    from megatron.core.optimizer import get_standard_config_overrides

    merged = dict(get_standard_config_overrides(config))
    merged.update(group_overrides)
    return merged


def group_learning_rates(optimizer) -> dict:
    """{group name: current lr} from the optimizer's param groups (one rank's view;
    megatron aligns param groups over ranks, so every group is present everywhere)."""
    rates = {}
    for group in optimizer.param_groups:
        name = group.get("lr_group")
        if name is not None:
            rates[name] = group["lr"]
    return rates
