"""Which model a checkpoint holds, read at plan time from the files beside its weights, so
that a model.init_checkpoint of another model is refused before the queue (the job would
die loading it).

A converted checkpoint (`audiollm convert hf-to-megatron`) keeps its decoder's HF config
(hf_config.json; a multimodal model's text config) and, where it has an encoder and an
adapter, Whisper's (whisper_config.json) and the adapter's (adapter_config.json: its kind,
frame_stack). A training checkpoint (RUN/checkpoints/step_N) belongs to a run
whose plan.json holds the composed model section. Each is compared key by key with the
config's `model` section. Torch-free (the submit side).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from orchestrator.plan.adapter_kinds import kind_name, setting
from orchestrator.plan.decoder_families import family_for_hf

# model.decoder key -> the HF decoder config's key
HF_DECODER_KEYS = {"hidden_size": "hidden_size", "num_layers": "num_hidden_layers",
                   "num_attention_heads": "num_attention_heads", "num_query_groups": "num_key_value_heads",
                   "kv_channels": "head_dim", "ffn_hidden_size": "intermediate_size", "vocab_size": "vocab_size"}
# model.encoder key -> Whisper's config key
WHISPER_KEYS = {"d_model": "d_model", "num_layers": "encoder_layers", "num_heads": "encoder_attention_heads",
                "ffn_dim": "encoder_ffn_dim", "num_mel_bins": "num_mel_bins"}


def _read(path: Path) -> Optional[dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _decoder_of_hf(config: dict) -> dict:
    """The model.decoder values a HF decoder config describes (`family` from its model_type;
    raises ValueError for a model_type no family has)."""
    values = {ours: config.get(theirs) for ours, theirs in HF_DECODER_KEYS.items()}
    values["num_query_groups"] = values["num_query_groups"] or values["num_attention_heads"]
    if values["kv_channels"] is None and values["hidden_size"] and values["num_attention_heads"]:
        values["kv_channels"] = values["hidden_size"] // values["num_attention_heads"]
    values["family"] = family_for_hf(str(config.get("model_type"))).name
    return values


def checkpoint_model(step_dir: Path) -> tuple[str, dict]:
    """(what the checkpoint at `step_dir` is, {"decoder": {...}, "encoder": {...}, "adapter":
    {...}}: the model sections it describes, the parts it does not hold left out)."""
    step_dir = Path(step_dir)
    hf = _read(step_dir / "hf_config.json")
    if hf is not None:
        sections = {"decoder": _decoder_of_hf(hf)}
        whisper = _read(step_dir / "whisper_config.json")
        if whisper is not None:
            sections["encoder"] = {ours: whisper.get(theirs) for ours, theirs in WHISPER_KEYS.items()}
        adapter = _read(step_dir / "adapter_config.json")  # an adapter's (kind; layer_mix where it names none)
        if adapter is not None:
            sections["adapter"] = adapter
        return f"a converted {hf.get('model_type')} checkpoint", sections
    run_dir = step_dir.parent.parent if step_dir.parent.name == "checkpoints" else None
    plan = _read(run_dir / "plan.json") if run_dir is not None else None
    model = ((plan or {}).get("config") or {}).get("model")
    if isinstance(model, dict):
        return f"a checkpoint of the run {run_dir}", {part: dict(model.get(part) or {})
                                                       for part in ("decoder", "encoder", "adapter")}
    return "a checkpoint", {}


# What must agree for the weights to load (the shapes); model.adapter's kind and
# frame_stack shape its linears.
COMPARED = {"decoder": ("family", *HF_DECODER_KEYS), "encoder": tuple(WHISPER_KEYS), "adapter": ("kind", "frame_stack")}


def _values(part: str, section) -> dict:
    """The COMPARED values of a model section (the config's, or a checkpoint's dict): the
    adapter's as its kind reads them (orchestrator/plan/adapter_kinds.py)."""
    if part == "adapter":
        return {"kind": kind_name(section), "frame_stack": setting(section, "frame_stack")}
    get = section.get if isinstance(section, dict) else lambda key: getattr(section, key)
    return {key: get(key) for key in COMPARED[part]}


def mismatches(model, step_dir: Path) -> list[str]:
    """One line per model.* value that the checkpoint at `step_dir` contradicts (`model`:
    the config's model section); [] where it agrees or says nothing."""
    try:
        what, sections = checkpoint_model(step_dir)
    except ValueError as exc:  # a HF model_type no decoder family has
        return [f"its decoder: {exc}"]
    lines = []
    for part in COMPARED:
        if not sections.get(part):
            continue
        held, own = _values(part, sections[part]), _values(part, getattr(model, part))
        for key in COMPARED[part]:
            theirs, ours = held.get(key), own.get(key)
            if theirs is not None and theirs != ours:
                lines.append(f"model.{part}.{key}={ours} but {what} has {theirs}")
    return lines
