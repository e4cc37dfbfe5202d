"""Validation and planning, as the launcher needs them.

`orchestrator.validate.validate(cfg, purpose) -> list[Finding]` and
`orchestrator.resolve.resolve(cfg, purpose) -> Plan` are used when present; until then, launcher-level checks and a stand-in
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


def check_launcher(launcher: Mapping[str, Any], generic: bool = True) -> list[str]:
    """Errors in the launcher section alone (each names the values and the fix).

    generic=False leaves out the rules orchestrator.validate also checks (kind,
    accelerator, nodes of a local run, max_requeues), so each error is said once."""
    errors = []
    entry = str(launcher.get("entry") or "")
    if "." not in entry.replace(":", "."):
        errors.append(f"launcher.entry={entry!r} must be a dotted path 'package.module.function'")
    for key in ("cpus_per_task", "timeout_min", "signal_delay_s", "array_parallelism"):
        if int(launcher[key]) < 1:
            errors.append(f"launcher.{key}={launcher[key]} must be at least 1")
    if not generic:
        return errors
    if launcher["kind"] not in KINDS:
        errors.append(f"launcher.kind={launcher['kind']!r} is not one of {', '.join(KINDS)}")
    if launcher["accelerator"] not in ACCELERATORS:
        errors.append(f"launcher.accelerator={launcher['accelerator']!r} is not one of {', '.join(ACCELERATORS)}")
    for key in ("nodes", "gpus_per_node"):
        if int(launcher[key]) < 1:
            errors.append(f"launcher.{key}={launcher[key]} must be at least 1")
    if int(launcher["max_requeues"]) < 0:
        errors.append(f"launcher.max_requeues={launcher['max_requeues']} must be 0 or more")
    if launcher["kind"] == "local" and int(launcher["nodes"]) != 1:
        errors.append(
            f"launcher.kind=local runs on this machine only, but launcher.nodes={launcher['nodes']}: "
            "set launcher.nodes=1 (and launcher.gpus_per_node to the number of ranks), or use launcher=slurm"
        )
    return errors


def validate(cfg, purpose: str = "train") -> tuple[list[str], list[str]]:
    """(errors, warnings) of a composed config: the launcher's own checks, then the
    project validator's (orchestrator.validate, purpose "train" or "plan")."""
    module = _project_module("validate")
    errors = check_launcher(cfg.launcher, generic=module is None)
    if module is None:
        return errors, []
    resolve_module = _project_module("resolve")
    obj = resolve_module.to_object(cfg) if resolve_module is not None else cfg
    findings = module.validate(obj, purpose)
    project_errors = [str(f) for f in findings if f.severity == "error"]
    warnings = [str(f) for f in findings if f.severity != "error"]
    # The project validator repeats some launcher rules; keep each message once.
    return errors + project_errors, warnings


def make_plan(cfg, purpose: str = "train") -> dict:
    """JSON-able plan of a composed (and validated) config."""
    module = _project_module("resolve")
    if module is None:
        launcher, parallel = cfg.launcher, cfg.parallel
        world = int(launcher.nodes) * int(launcher.gpus_per_node)
        tp, pp, cp = (int(parallel.get(k, 1) or 1) for k in ("tp", "pp", "cp"))
        return {
            "world_size": world, "nodes": int(launcher.nodes), "gpus_per_node": int(launcher.gpus_per_node),
            "tp": tp, "pp": pp, "cp": cp, "dp": max(1, world // (tp * pp * cp)), "argv": [],
        }
    plan = module.resolve(cfg, purpose=purpose)
    return plan.to_dict()
