"""Command-line shorthands that stand for several keys.

`parallel.recompute=none|selective|full` sets the three recompute fields at once, so a
sweep can compare the choices on one axis (`audiollm plan -m parallel.recompute=none,
selective,full`); Megatron-LM's own `--recompute-activations` is such a shorthand for
selective. `full` is uniform recompute of one layer per chunk (Megatron-LM's usual
`--recompute-granularity full --recompute-method uniform --recompute-num-layers 1`);
the fields can still be set one by one.
"""

from __future__ import annotations

from typing import Sequence

RECOMPUTE = {
    "none": {"granularity": "null", "method": "null", "num_layers": "null"},
    "null": {"granularity": "null", "method": "null", "num_layers": "null"},
    "selective": {"granularity": "selective", "method": "null", "num_layers": "null"},
    "full": {"granularity": "full", "method": "uniform", "num_layers": "1"},
}


def expand_shorthands(overrides: Sequence[str]) -> list[str]:
    out: list[str] = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key == "parallel.recompute" and value in RECOMPUTE:
            out += [f"parallel.recompute.{field}={v}" for field, v in RECOMPUTE[value].items()]
        else:
            out.append(item)
    return out
