"""Sweep expansion with Hydra's override grammar and BasicSweeper semantics.

`a=1,2 b=x,y` is the cartesian product in the order given (a varies slowest), as
`hydra -m` does; `range(...)`, `choice(...)` and quoted values follow Hydra's parser.
"""

from __future__ import annotations

from typing import Sequence


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
