"""A sweep's points: Hydra's sweep syntax expanded, and each point's configuration composed.

Expansion uses Hydra's override grammar and BasicSweeper semantics: `a=1,2 b=x,y` is
the cartesian product in the order given (a varies slowest), as `hydra -m` does;
`range(...)`, `choice(...)` and quoted values follow Hydra's parser.

Composing a hundred points one by one costs about 0.1 s each. Most sweeps vary values
(`parallel.tp=1,2,4`), not groups, so `compose_points` composes once per distinct set of
group choices and applies each point's value overrides to a copy, as Hydra applies
them after the defaults list; tests/orchestrator/test_plan_sweep.py checks the result
against a full compose of every point.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence


class SweepError(ValueError):
    pass


def expand(overrides: Sequence[str]) -> list[list[str]]:
    """Every point of the sweep as a full override list (non-swept overrides included)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    except HydraException as exc:
        raise SweepError(f"invalid sweep overrides {' '.join(overrides)}: {exc}") from None
    return [list(point) for point in batches[0]]


def swept_keys(overrides: Sequence[str]) -> list[str]:
    """Keys that take more than one value (for naming points in tables)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [o.get_key_element() for o in parsed if o.is_sweep_override()]


def _is_value_override(item: str) -> bool:
    """A plain `section.key=value`: no group choice (`model=x`, `a/b=c`), no +/++/~."""
    key = item.split("=", 1)[0]
    return "=" in item and "." in key and not key.startswith(("+", "~")) and "/" not in key and "@" not in key


def compose_points(points: Sequence[Sequence[str]]) -> list[tuple[Any, str | None]]:
    """(DictConfig, None) or (None, why it cannot be composed) per point."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from orchestrator.plan.compose import ComposeError, compose
    from orchestrator.plan.shorthands import expand_shorthands

    parser = OverridesParser.create()
    bases: dict[tuple, Any] = {}
    out = []
    for point in points:
        point = expand_shorthands(point)
        structural = tuple(o for o in point if not _is_value_override(o))
        values = [o for o in point if _is_value_override(o)]
        if structural not in bases:
            try:
                bases[structural] = compose(list(structural))
            except ComposeError as exc:
                bases[structural] = exc
        base = bases[structural]
        if isinstance(base, Exception):
            out.append((None, str(base)))
            continue
        cfg = copy.deepcopy(base)
        problem = None
        for override in parser.parse_overrides(values):
            key = override.key_or_group
            if OmegaConf.select(cfg, key, default=_MISSING) is _MISSING:
                problem = f"{override.input_line}: the configuration has no key {key}"
                break
            try:
                OmegaConf.update(cfg, key, override.value(), merge=True)
            except OmegaConfBaseException as exc:  # a value of the wrong type
                problem = f"{override.input_line}: {str(exc).splitlines()[0]}"
                break
        out.append((None, problem) if problem else (cfg, None))
    return out


_MISSING = object()
