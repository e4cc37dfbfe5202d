"""A run's W&B settings: the config's `logger` section over W&B's own environment
variables ($WANDB_MODE, $WANDB_PROJECT, $WANDB_ENTITY), as users of W&B set them.

Set in the config, a value wins; unset (null), the environment's is taken; neither, the
default (offline, project "audiollm", wandb's default entity). W&B's files go where
$WANDB_DIR says, else into the run directory. The job reads them where
it runs (SLURM passes the submitting shell's environment on) and says which it took and
from where. Plan side (no torch, no wandb): validation and the job share the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

WANDB_MODES = ("offline", "online", "disabled")
# $WANDB_MODE as W&B spells it (dryrun and run are its older names).
_ENV_MODES = {"offline": "offline", "dryrun": "offline", "online": "online", "run": "online",
              "disabled": "disabled"}
DEFAULTS = {"mode": "offline", "project": "audiollm", "entity": None}


@dataclass(frozen=True)
class WandbSettings:
    mode: str
    project: str
    entity: Optional[str]
    dir: str  # where W&B writes its files (its wandb/ folder): $WANDB_DIR, else the run directory
    lines: tuple  # one per setting: its value and where it came from


def _pick(key: str, configured, env: Mapping[str, str]) -> tuple:
    """(value, where it came from) of one setting."""
    variable = f"WANDB_{key.upper()}"
    raw = env.get(variable) or None
    from_env = _ENV_MODES.get(raw.strip().lower()) if key == "mode" and raw is not None else raw
    if configured is not None:
        over = f", over ${variable}={from_env}" if from_env is not None and from_env != configured else ""
        return configured, f"{configured} (logger.{key}{over})"
    if from_env is not None:
        return from_env, f"{from_env} (${variable}; logger.{key} unset)"
    default = DEFAULTS[key]
    if raw is not None:  # a $WANDB_MODE that W&B does not know
        return default, f"{default} (${variable}={raw} is not one of {', '.join(_ENV_MODES)}: the default)"
    return default, f"{default if default is not None else 'wandb default'} (neither logger.{key} nor ${variable})"


def wandb_settings(logger: Mapping, env: Mapping[str, str], run_dir: str = "the run directory") -> WandbSettings:
    """The W&B mode, project and entity of a run whose logger section is `logger`, in the
    environment `env` (os.environ where the job runs), and where its files go: $WANDB_DIR
    as W&B's users set it, else `run_dir`."""
    picked = {key: _pick(key, logger.get(key), env) for key in ("mode", "project", "entity")}
    lines = [f"W&B {key}: {why}" for key, (_, why) in picked.items()]
    files = env.get("WANDB_DIR") or None
    lines.append(f"W&B files: {files}/wandb ($WANDB_DIR, instead of the run directory)" if files
                 else f"W&B files: {run_dir}/wandb ($WANDB_DIR unset)")
    return WandbSettings(mode=picked["mode"][0], project=picked["project"][0], entity=picked["entity"][0],
                         dir=str(files or run_dir), lines=tuple(lines))
