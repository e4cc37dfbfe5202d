"""The project's converted megatron checkpoint: one state dict per (TP rank, PP rank).

    OUT/audiollm_checkpoint.json   format, tp, pp, vocab sizes, what it holds
    OUT/hf_config.json             the source HF Gemma2 config.json, verbatim
    OUT/whisper_config.json        the source HF Whisper config.json (with --whisper)
    OUT/model/tp{TT}_pp{PPP}.pt    {parameter name: tensor} of that rank, names as in the
                                   AudioLLM (language_model.*, encoder.* on the first stage)

Each rank of a job with the same TP/PP loads its own file (`load_converted_checkpoint`);
no collective is needed and the layout is exactly what the model's state_dict holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

import torch

FORMAT = "audiollm-megatron/1"
META = "audiollm_checkpoint.json"


def shard_path(ckpt_dir: Path, tp_rank: int, pp_rank: int) -> Path:
    return Path(ckpt_dir) / "model" / f"tp{tp_rank:02d}_pp{pp_rank:03d}.pt"


def write_checkpoint(ckpt_dir: Path, shards: Dict[Tuple[int, int], Dict[str, torch.Tensor]], meta: dict) -> None:
    ckpt_dir = Path(ckpt_dir)
    (ckpt_dir / "model").mkdir(parents=True, exist_ok=True)
    for (t, p), state in shards.items():
        torch.save({k: v.contiguous().clone() for k, v in state.items()}, shard_path(ckpt_dir, t, p))
    (ckpt_dir / META).write_text(json.dumps({"format": FORMAT, **meta}, indent=2))


def read_meta(ckpt_dir: Path) -> dict:
    path = Path(ckpt_dir) / META
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: not a checkpoint written by `audiollm convert hf-to-megatron`")
    meta = json.loads(path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def read_shards(ckpt_dir: Path) -> Dict[Tuple[int, int], Dict[str, torch.Tensor]]:
    meta = read_meta(ckpt_dir)
    return {(t, p): torch.load(shard_path(ckpt_dir, t, p), map_location="cpu", weights_only=True)
            for t in range(meta["tp"]) for p in range(meta["pp"])}


# Parameters a converted checkpoint does not hold: the adapter (trained from scratch),
# LoRA adapters, TransformerEngine's extra state, and the encoder when converted without --whisper.
_MAY_BE_MISSING = ("adapter.", )


def load_converted_checkpoint(model: torch.nn.Module, ckpt_dir: Path, tp_rank: int, pp_rank: int,
                              tp: int, pp: int) -> List[str]:
    """Load this rank's shard into `model` (an AudioLLM chunk, or a bare Gemma2Model).
    Fails, naming the keys, unless every checkpoint tensor finds its parameter and every
    parameter is loaded except those a conversion cannot provide (adapter, LoRA, encoder
    without --whisper). Returns the parameter names left at their initial values."""
    meta = read_meta(ckpt_dir)
    if (meta["tp"], meta["pp"]) != (tp, pp):
        raise ValueError(
            f"checkpoint {ckpt_dir} is sharded for tp={meta['tp']}, pp={meta['pp']} but the job runs tp={tp}, "
            f"pp={pp}; convert again with --tp {tp} --pp {pp}")
    state = torch.load(shard_path(ckpt_dir, tp_rank, pp_rank), map_location="cpu", weights_only=True)
    own = model.state_dict()
    if not any(k.startswith("language_model.") for k in own):
        state = {k[len("language_model."):]: v for k, v in state.items() if k.startswith("language_model.")}
    unexpected = sorted(set(state) - set(own))
    optional = _MAY_BE_MISSING + (() if meta.get("has_encoder") else ("encoder.",))
    missing = sorted(k for k in set(own) - set(state) if not _optional(k, optional))
    if unexpected or missing:
        raise ValueError(f"checkpoint {ckpt_dir} does not fit the model: "
                         f"unexpected {unexpected[:20]}{' ...' if len(unexpected) > 20 else ''}; "
                         f"missing {missing[:20]}{' ...' if len(missing) > 20 else ''}")
    model.load_state_dict(state, strict=False)
    return sorted(k for k in own if k not in state and not k.endswith("_extra_state"))


def _optional(name: str, prefixes: Iterable[str]) -> bool:
    return name.endswith("_extra_state") or ".lora_" in name or any(name.startswith(p) for p in prefixes)
