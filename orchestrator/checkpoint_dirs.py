"""What a checkpoint directory is, told from its files alone (submit side: no torch).

- a megatron dist_checkpointing directory (`metadata.json` names its sharded backend):
  a converted checkpoint (`audiollm convert hf-to-megatron`, with CONVERTED_META beside)
  or one step of a training run (`RUN/checkpoints/step_000100`);
- a run directory: its `checkpoints/latest` step;
- a HF model directory (`config.json` with a `model_type`): not loadable before conversion.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Tuple

CONVERTED_META = "audiollm_checkpoint.json"
# Sub-directories of a HF export (megatron-to-hf) that hf-to-megatron reads back.
ENCODER_SUBDIR = "whisper_encoder"
ADAPTER_SUBDIR = "audio_adapter"


def is_dist_checkpoint(path: Path) -> bool:
    meta = Path(path) / "metadata.json"
    if not meta.is_file():
        return False
    try:
        return "sharded_backend" in json.loads(meta.read_text())
    except (OSError, ValueError):
        return False


def resolve_model_checkpoint(path: str) -> Tuple[Optional[str], Optional[str]]:
    """(dist_checkpointing directory to load weights from, None) or (None, what is wrong
    and how to fix it)."""
    p = Path(path).expanduser()
    if not p.exists():
        return None, f"{path} does not exist"
    if is_dist_checkpoint(p):
        return str(p.resolve()), None
    latest = p / "checkpoints" / "latest"
    if latest.is_file():
        step = p / "checkpoints" / latest.read_text().strip()
        if is_dist_checkpoint(step):
            return str(step.resolve()), None
        return None, f"{path} is a run directory whose checkpoints/latest names {step.name}, which is not a checkpoint"
    config = p / "config.json"
    if config.is_file():
        try:
            model_type = json.loads(config.read_text()).get("model_type")
        except ValueError:
            model_type = None
        if model_type:
            return None, (f"{path} is a HF checkpoint (model_type {model_type!r}); convert it first: "
                          f"audiollm convert hf-to-megatron --hf {path} --out {p}_megatron "
                          f"[--whisper WHISPER_DIR], and point at the output")
    return None, (f"{path} is not a checkpoint: expected a directory written by `audiollm convert hf-to-megatron`, "
                  f"a training checkpoint (RUN/checkpoints/step_N) or a run directory")
