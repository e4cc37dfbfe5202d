"""`audiollm plan -m`: every point of a sweep planned, one row each, best first.

A row: valid or the rules it breaks, memory of the most loaded stage against the GPU,
trainable parameters and model FLOPs per GPU, the bytes each GPU sends per step by kind
of collective, the pipeline bubble, and the estimated step time and tokens/s per GPU
(orchestrator/plan/layout_estimate.py, which says what it rests on). Points that cannot
run (a rule broken, or more memory than the GPU has) come last. Errors every point
shares (a missing checkpoint, say) are said once above the table: they do not rank.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Sequence

from orchestrator.plan.sweep import compose_points, expand, swept_keys


@dataclass
class Row:
    point: dict  # swept key -> value
    overrides: list
    errors: list = field(default_factory=list)  # full texts
    memory_gib: float | None = None
    device_gib: float | None = None
    fits: bool | None = None
    trainable_per_gpu: int | None = None
    tflop_per_gpu: float | None = None  # hardware TFLOPs of the busiest GPU per step
    wire_gb: dict | None = None
    crosses_nodes: dict | None = None
    bubble: float | None = None
    step_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    inputs: list | None = None

    @property
    def runs(self) -> bool:
        """No error at all (its own or one every point shares), and it fits."""
        return not self.errors and bool(self.fits)


def rule_of(error: str) -> str:
    match = re.search(r"\[([A-Za-z0-9_]+)\]", error)
    return match.group(1) if match else error.split(":", 1)[0][:40]


def plan_rows(overrides: Sequence[str]) -> list[Row]:
    """Every point planned (the same compose, validation and estimates as `audiollm plan`)."""
    from orchestrator.plan.resolve import resolve, to_object
    from orchestrator.plan.validate import validate

    points = expand(overrides)
    keys = swept_keys(overrides)
    rows = []
    for point, (cfg, problem) in zip(points, compose_points(points)):
        values = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[1] if "=" in o else "" for o in point}
        row = Row(point={k: values.get(k, "") for k in keys}, overrides=list(point))
        rows.append(row)
        if cfg is None:
            row.errors = [problem]
            continue
        obj = to_object(cfg)
        try:
            plan = resolve(obj, purpose="plan", keep_errors=True).to_dict()
        except Exception:
            found = [str(f) for f in validate(to_object(cfg), "plan") if f.severity == "error"]
            if not found:
                raise  # a defect of the planner, not of the point
            row.errors = found
            continue
        # A layout that does not fit is the row's "no fit" (its memory column), not a rule.
        row.errors = [e for e in plan["errors"] if rule_of(e) != "memory"]
        memory = plan["memory"]
        row.memory_gib, row.device_gib, row.fits = memory["total_gib"], memory["device_gib"], memory["fits"]
        row.trainable_per_gpu = max(s["trainable"] for s in plan["parameters"]["per_rank_by_stage"])
        # The hardware FLOPs of a step's average GPU; on GPUs the busiest one's (below).
        row.tflop_per_gpu = plan["flops"]["hardware_flops_per_step"] / plan["world_size"] / 1e12
        step = plan["step_estimate"]  # None on CPUs
        if step is not None:
            row.tflop_per_gpu = step["busiest_gpu_tflop"]
            row.wire_gb, row.crosses_nodes, row.inputs = step["wire_gb"], step["crosses_nodes"], step["inputs"]
            row.bubble, row.step_s, row.tokens_per_s_per_gpu = step["bubble"], step["step_s"], step["tokens_per_s_per_gpu"]
    return rows


def shared_errors(rows: list[Row]) -> list[str]:
    """Errors every planned point has: they say nothing about the layout."""
    planned = [r for r in rows if r.memory_gib is not None]
    if not planned:
        return []
    common = set(planned[0].errors)
    for row in planned[1:]:
        common &= set(row.errors)
    return sorted(common)


def ranked(rows: list[Row], shared: Sequence[str] = ()) -> list[Row]:
    """Runnable points by estimated tokens/s per GPU, best first; then those that do not
    fit; then those that break a rule."""
    def own_errors(row):
        return [e for e in row.errors if e not in shared]

    def key(row):
        rate = row.tokens_per_s_per_gpu if row.tokens_per_s_per_gpu is not None else -math.inf
        return (bool(own_errors(row)), row.fits is False, -rate)

    return sorted(rows, key=key)


def render(rows: list[Row], overrides: Sequence[str]) -> str:
    shared = shared_errors(rows)
    order = ranked(rows, shared)
    keys = _short_names(list(order[0].point) if order else [])
    header = ["#", *keys, "valid", "memory GiB", "train M/GPU", "TFLOP/GPU", "TP GB", "CP GB", "PP GB", "DP GB",
              "bubble", "step s", "tok/s/GPU"]
    table = []
    for i, row in enumerate(order, 1):
        own = [rule_of(e) for e in row.errors if e not in shared]
        valid = "ok" if not own else ",".join(dict.fromkeys(own))
        if row.memory_gib is None:
            table.append([str(i), *row.point.values(), valid] + ["-"] * (len(header) - len(keys) - 2))
            continue
        memory = f"{row.memory_gib:.1f}" + ("" if row.fits else f" > {row.device_gib:.0f}")
        if not row.fits and valid == "ok":
            valid = "no fit"
        cells = [str(i), *row.point.values(), valid, memory, f"{row.trainable_per_gpu / 1e6:.0f}",
                 f"{row.tflop_per_gpu:.0f}"]
        if row.wire_gb is not None:
            cells += [_gb(row.wire_gb[k], row.crosses_nodes[k]) for k in ("tp", "cp", "pp", "dp")]
            cells += [f"{row.bubble:.0%}", f"{row.step_s:.2f}", f"{row.tokens_per_s_per_gpu:,.0f}"]
        else:
            cells += ["-"] * 7
        table.append(cells)
    widths = [max(len(str(r[c])) for r in [header, *table]) for c in range(len(header))]
    lines = ["  ".join(str(cell).rjust(w) for cell, w in zip(r, widths)) for r in [header, *table]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = [f"{len(rows)} points of `audiollm plan -m {' '.join(overrides)}`, best estimate first:", "", *lines, ""]
    out.append("GB: what one GPU of the busiest stage sends per step (ring collectives), * over the network "
               "between nodes; TFLOP: what that GPU computes per step (recompute included); memory: the most "
               "loaded stage (as `audiollm plan`).")
    inputs = next((r.inputs for r in order if r.inputs), None)
    if inputs:
        out.append("the estimate rests on: " + "; ".join(inputs))
    if shared:
        out.append(f"\nevery point has {len(shared)} error(s) that do not depend on the layout "
                   f"(`audiollm train` refuses them all until fixed):")
        out += [f"  {e}" for e in shared]
    return "\n".join(out)


def _short_names(keys: list[str]) -> list[str]:
    """Each swept key by its last component (parallel.tp -> tp), longer where two would clash."""
    for depth in range(1, max((k.count(".") + 1 for k in keys), default=1) + 1):
        names = [".".join(k.split(".")[-depth:]) for k in keys]
        if len(set(names)) == len(names):
            return names
    return keys


def _gb(value: float, crosses: bool) -> str:
    if value == 0:
        return "-"
    return (f"{value:.1f}" if value >= 0.1 else f"{value:.3f}") + ("*" if crosses else "")


def to_json(rows: list[Row]) -> dict:
    """The table as data: each point's own `valid` (the table's "ok": no rule of its own
    broken, and it fits) and whether it `runs` (valid, and no error every point shares)."""
    shared = shared_errors(rows)
    points = []
    for row in ranked(rows, shared):
        valid = bool(row.fits) and not [e for e in row.errors if e not in shared]
        points.append(asdict(row) | {"valid": valid, "runs": row.runs})
    return {"shared_errors": shared, "points": points}
