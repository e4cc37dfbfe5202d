"""Validation and planning, as the launcher needs them.

`orchestrator.validate.validate(cfg) -> list[str]` and `orchestrator.resolve.resolve(cfg)
-> Plan` are used when present; until then, launcher-level checks and a stand-in
plan ({"world_size", "nodes", "gpus_per_node", "tp", "pp", "cp", "dp", "argv": []}).
"""

from __future__ import annotations

from typing import Any, Mapping

KINDS = ("local", "slurm")


def _project_module(name: str):
    """orchestrator.<name> if this source tree has it, else None.

    Checked by file, not by import: an editable install elsewhere could otherwise
    supply a module that does not match this tree's schemas.
    """
    import importlib
    from pathlib import Path

    import orchestrator

    if not (Path(orchestrator.__file__).parent / f"{name}.py").exists():
        return None
    return importlib.import_module(f"orchestrator.{name}")
ACCELERATORS = ("cpu", "gpu")


def check_launcher(launcher: Mapping[str, Any]) -> list[str]:
    """Errors in the launcher section alone (each names the values and the fix)."""
    errors = []
    if launcher["kind"] not in KINDS:
        errors.append(f"launcher.kind={launcher['kind']!r} is not one of {', '.join(KINDS)}")
    if launcher["accelerator"] not in ACCELERATORS:
        errors.append(f"launcher.accelerator={launcher['accelerator']!r} is not one of {', '.join(ACCELERATORS)}")
    for key in ("nodes", "gpus_per_node", "cpus_per_task", "timeout_min"):
        if int(launcher[key]) < 1:
            errors.append(f"launcher.{key}={launcher[key]} must be at least 1")
    if int(launcher["max_requeues"]) < 0:
        errors.append(f"launcher.max_requeues={launcher['max_requeues']} must be 0 or more")
    if launcher["kind"] == "local" and int(launcher["nodes"]) != 1:
        errors.append(
            f"launcher.kind=local runs on this machine only, but launcher.nodes={launcher['nodes']}: "
            "set launcher.nodes=1 (and launcher.gpus_per_node to the number of ranks), or use launcher=slurm"
        )
    entry = str(launcher.get("entry") or "")
    if "." not in entry.replace(":", "."):
        errors.append(f"launcher.entry={entry!r} must be a dotted path 'package.module.function'")
    return errors


def validate(cfg) -> list[str]:
    """All errors of a composed config: the launcher's own, then the project validator's."""
    errors = check_launcher(cfg.launcher)
    module = _project_module("validate")
    if module is None:
        return errors
    return errors + [str(e) for e in module.validate(cfg)]


def make_plan(cfg) -> dict:
    """JSON-able plan of a composed config."""
    module = _project_module("resolve")
    if module is None:
        launcher, parallel = cfg.launcher, cfg.parallel
        world = int(launcher.nodes) * int(launcher.gpus_per_node)
        tp, pp, cp = (int(parallel.get(k, 1) or 1) for k in ("tp", "pp", "cp"))
        return {
            "world_size": world, "nodes": int(launcher.nodes), "gpus_per_node": int(launcher.gpus_per_node),
            "tp": tp, "pp": pp, "cp": cp, "dp": max(1, world // (tp * pp * cp)), "argv": [],
        }
    plan = module.resolve(cfg)
    return plan.to_dict() if hasattr(plan, "to_dict") else dict(plan)
