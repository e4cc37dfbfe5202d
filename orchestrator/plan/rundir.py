"""Run directories: `<run.output_root>/<run.experiment>/<run name>/`.

How a run is identified when `run.name` is unset: the name is
`<recipe>-<8 hex digits>`, the digits being a hash of the composed configuration
without the keys that do not change what is trained (`run.resume`, `run.name`,
`launcher.dry_run`, `launcher.wait`). So re-running the same command (same recipe,
same overrides, hence the same composed config) lands in the same directory, and
with `run.resume=auto` continues from its latest checkpoint; changing any value
that matters (lr, nodes, iters, ...) starts a new run. A timestamp would make every
invocation a new run, so "run it again to resume" could not work. Set `run.name`
to choose the directory yourself.

Files in a run directory (written before anything is submitted, except where noted;
every file but the append-only logs and metrics is written atomically: a temporary file
renamed over it, so a crash or a full disk never leaves half of one):

    config.yaml      the composed configuration, headed by two comments: the recipe's
                     file and the config search path it was found on (--config-dir,
                     $AUDIOLLM_CONFIG_PATH, audiollm.yaml, shipped)
    plan.json        the resolved plan (the job reads this, never raw YAML)
    launch.json      launch record: one entry per submission (job ids, command line,
                     overrides, `source`: recipe, recipe_file and config_path, project
                     version, time)
    wandb_id         W&B run id, kept across restarts
    submitit/        submitit's pickles and per-task stdout/stderr (SLURM-side logs)
    logs/rank<N>.log per-rank log written by the job (appended across restarts)
    state.json       the job's own view: RUNNING / PREEMPTED / COMPLETED / FAILED, attempt
    checkpoints/     step_<N>/ written by the job; `latest` names the newest
    metrics.jsonl    one JSON object per step: {"step", "loss", ...}
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Mapping, Sequence

# Keys that do not change what is trained: excluded from the run identity.
IDENTITY_EXCLUDED = ("run.resume", "run.name", "launcher.dry_run", "launcher.wait")


# The last line of config.yaml: a truncated YAML file is often still valid YAML, so a file
# cut short is told by the missing end (`damage`).
CONFIG_END = "# end of config.yaml\n"


class RunDirError(ValueError):
    """The run directory cannot be used as asked."""


def config_identity(cfg_container: Mapping[str, Any]) -> str:
    """8 hex digits identifying what a composed config trains (see module docstring)."""
    data = json.loads(json.dumps(cfg_container, default=str))
    for dotted in IDENTITY_EXCLUDED:
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.get(key, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:8]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", name).strip("_") or "run"


def default_run_name(cfg_container: Mapping[str, Any]) -> str:
    recipe = cfg_container.get("recipe") or "run"
    return f"{_safe(str(recipe))}-{config_identity(cfg_container)}"


def run_dir_for(cfg_container: Mapping[str, Any]) -> Path:
    run = cfg_container["run"]
    name = run.get("name") or default_run_name(cfg_container)
    return Path(run["output_root"]) / _safe(str(run["experiment"])) / _safe(str(name))


def has_checkpoint(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "latest").exists()


def check_resume(run_dir: Path, resume: str) -> bool:
    """True when the run continues an existing one. Raises RunDirError when it may not."""
    if resume not in ("auto", "never"):
        raise RunDirError(f"run.resume must be 'auto' or 'never', got {resume!r}")
    if not has_checkpoint(run_dir):
        return False
    if resume == "never":
        raise RunDirError(
            f"run directory {run_dir} already has checkpoints and run.resume=never: "
            "pass run.resume=auto to continue it, or run.name=<new name> to start another run"
        )
    return True


def project_version() -> str:
    try:
        from importlib.metadata import version

        return version("audiollm")
    except Exception:  # not installed (plain source checkout)
        return "unknown"


def write_json(path: Path, data: Any) -> None:
    """Write atomically: readers (status, the job) never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename it over `path`: a crash or a
    full disk leaves the old file whole (and no temporary file behind)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def damage(path: Path) -> str | None:
    """What is wrong with a run directory's JSON or YAML file, in a few words; None when it
    is readable or absent."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        return f"{path.name} cannot be read ({exc})"
    try:
        if path.suffix == ".yaml":
            import yaml

            yaml.safe_load(text)
            if path.name == "config.yaml" and not text.endswith(CONFIG_END):
                return (f"{path.name} is damaged ({len(text.encode())} bytes, cut short: its last line is not "
                        f"{CONFIG_END.strip()!r})")
        else:
            json.loads(text)
    except Exception as exc:  # noqa: BLE001 - json's and yaml's errors alike
        where = getattr(exc, "lineno", None) or getattr(getattr(exc, "problem_mark", None), "line", None)
        detail = f" at line {where}" if where else ""
        size = len(text.encode())
        return f"{path.name} is damaged ({size} bytes, not valid {path.suffix[1:].upper()}{detail})"
    return None


class RunBusy(RuntimeError):
    """Another command holds the run directory's submission lock for too long."""


@contextlib.contextmanager
def submission_lock(run_dir: Path, wait_s: float = 120.0):
    """Held by a command that submits a run, from its check that the run has no active
    job to the record of its own launch (launch.json): two identical commands started
    together would otherwise both pass the check and run in one directory. The second
    waits here for the first to record its job, then finds it and is refused. An
    advisory flock on `.submit.lock`: released by the kernel if the holder dies."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".submit.lock", "a+") as handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RunBusy(f"another command has been submitting run {run_dir} for over {wait_s:.0f} s "
                                  f"(it holds {run_dir / '.submit.lock'}); wait for it, or check "
                                  f"`audiollm status {run_dir}`") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare(run_dir: Path, config_yaml: str, plan: Mapping[str, Any]) -> None:
    """Write config.yaml, plan.json and the W&B id (kept if present) before submission."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    write_text_atomic(run_dir / "config.yaml", config_yaml + CONFIG_END)
    write_json(run_dir / "plan.json", dict(plan))
    wandb_id = run_dir / "wandb_id"
    if not wandb_id.exists():
        write_text_atomic(wandb_id, uuid.uuid4().hex[:16] + "\n")


def record_launch(run_dir: Path, entry: Mapping[str, Any]) -> None:
    """Append one submission to launch.json."""
    path = run_dir / "launch.json"
    if damage(path):  # kept for whoever wants the earlier launches back; a new record starts
        os.replace(path, path.with_name("launch.json.damaged"))
    record = read_json(path, default={"launches": []})
    record["launches"].append(
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "submitted_at": time.time(),
            "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
            "version": project_version(),
            **entry,
        }
    )
    write_json(path, record)


def last_launch(run_dir: Path) -> dict | None:
    record = read_json(Path(run_dir) / "launch.json", default={})
    launches = (record.get("launches") if isinstance(record, dict) else None) or []
    return launches[-1] if launches else None


def read_metrics(run_dir: Path) -> list[dict]:
    out = []
    try:
        lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being written
    return out


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "plan.json").exists()


def point_dirs(sweep_dir: Path) -> Sequence[Path]:
    sweep = read_json(Path(sweep_dir) / "sweep.json", default=None)
    if sweep is None:
        return []
    return [Path(sweep_dir) / p["dir"] for p in sweep["points"]]
