"""`model.init_checkpoint`: pretrained weights into a fresh run (Megatron-LM's
`--finetune`: weights only; step 0, fresh optimizer and scheduler).

The source is a megatron dist_checkpointing directory: a converted HF checkpoint
(`audiollm convert hf-to-megatron`) or a training checkpoint of an earlier run.
dist_checkpointing reshards it to this job's TP / PP / virtual-PP layout, whatever
layout wrote it. It runs on every rank after the model chunks are built and before
LoRA and the freezes (loop.Trainer), so LoRA wraps pretrained weights. LoRA factors the
checkpoint holds (an imported PEFT adapter, an earlier LoRA run) are loaded after LoRA is
added (`load_init_lora`), when the run's lora section has the same rank and alpha: the
adapter is fine-tuned on.

Every model tensor must be accounted for before the first step, on every rank alike:
- a tensor the model needs and the checkpoint lacks is an error, except the modules
  that start fresh in a fine-tune: LoRA factors, the adapter when the checkpoint has
  none (a converted HF model), the adapter's CTC head;
- a checkpoint tensor the model does not have (a renamed tensor, another model) and a
  shape that differs are errors naming the tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

import torch
import torch.distributed as dist

_MAX_NAMED = 12


class InitCheckpointError(ValueError):
    """The init checkpoint does not fit the model."""


def _flat_sharded(chunk, prefix: str = "") -> Dict[str, object]:
    """{state-dict name: ShardedTensor / ShardedTensorFactory / ShardedObject} of a chunk."""
    from orchestrator.train.checkpoint import _SHARDING_METADATA, _unwrap_ddp

    return _unwrap_ddp(chunk).sharded_state_dict(prefix=prefix, metadata=dict(_SHARDING_METADATA))


def _global_shape(sharded) -> tuple:
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory

    if isinstance(sharded, ShardedTensorFactory):
        return tuple(sharded.build()[0].global_shape)
    return tuple(sharded.global_shape)


def _starts_fresh(key: str, stored_keys) -> str:
    """The reason a model tensor missing from the checkpoint may start at its initial
    value, or '' when it may not."""
    if ".lora_" in key:
        return "LoRA"
    if key.startswith("adapter.ctc_head."):
        return "CTC head"
    if key.startswith("adapter.") and not any(k.startswith("adapter.") for k in stored_keys):
        return "adapter"
    return ""


def _names(items: Sequence[str]) -> str:
    items = sorted(items)
    return ", ".join(items[:_MAX_NAMED]) + (f" ... ({len(items)} in all)" if len(items) > _MAX_NAMED else "")


def load_init_checkpoint(path: str | Path, chunks: Sequence, prefix: str = "", lora: bool = False) -> dict:
    """Load the weights of `path` into this rank's model chunks (collective: call on
    every rank). `prefix` names the part of the AudioLLM the chunks are (a bare decoder:
    `language_model.`); checkpoint tensors outside it are then ignored. `lora`: the run
    adds LoRA after this load, and `load_init_lora` reads the checkpoint's LoRA factors
    then (else they are tensors the model does not have). Returns {'loaded': n, 'fresh': {reason: n},
    'keys': the checkpoint keys loaded} over the whole model; raises InitCheckpointError before anything is loaded
    when the checkpoint does not fit."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    from orchestrator.train.dist_format import load_model_state, stored_model_tensors
    from orchestrator.train.checkpoint import _unwrap_ddp

    stored = {k: v for k, v in stored_model_tensors(path).items() if k.startswith(prefix)}
    requests: List[dict] = []
    skipped: List[set] = []  # per chunk: names left at their initial values
    needed, fresh, mismatched = set(), {}, []
    for chunk in chunks:
        request, skip = {}, set()
        for name, sharded in _flat_sharded(chunk, prefix).items():
            if isinstance(sharded, ShardedObject):
                skip.add(name)  # extra state (TransformerEngine's fp8 metadata): rebuilt by the layer
                continue
            key = sharded.key
            needed.add(key)
            if key not in stored:
                fresh[key] = _starts_fresh(key, stored)
                skip.add(name)
                continue
            model_shape, stored_shape = _global_shape(sharded), tuple(stored[key].global_shape)
            # vocabulary rows are padded per layout: only the other dimensions must agree
            skip_rows = 1 if getattr(sharded, "allow_shape_mismatch", False) else 0
            if model_shape[skip_rows:] != stored_shape[skip_rows:]:
                mismatched.append(f"{key} (checkpoint {stored_shape}, model {model_shape})")
                continue
            request[name] = sharded
        requests.append(request)
        skipped.append(skip)
    # The same verdict on every rank: each sees only its own stages' tensors.
    gathered: List[dict] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"needed": needed, "fresh": fresh, "mismatched": mismatched})
    needed = set().union(*(g["needed"] for g in gathered))
    fresh = {k: v for g in gathered for k, v in g["fresh"].items()}
    mismatched = sorted(set().union(*(g["mismatched"] for g in gathered)))
    missing = sorted(k for k, reason in fresh.items() if not reason)
    unexpected = sorted(k for k in set(stored) - needed if not (lora and ".lora_" in k))
    problems = []
    if missing:
        problems.append(f"the model needs tensors the checkpoint lacks: {_names(missing)}")
    if unexpected:
        hint = (" (LoRA adapters of an earlier run: export it with `audiollm convert megatron-to-hf`, which "
                "merges them, and convert that back)") if any(".lora_" in k for k in unexpected) else ""
        problems.append(f"the checkpoint holds tensors the model does not have: {_names(unexpected)}{hint}")
    if mismatched:
        problems.append(f"shapes differ: {_names(mismatched)}")
    if problems:
        raise InitCheckpointError(
            f"model.init_checkpoint={path} does not fit model (this config's model section): " + "; ".join(problems)
            + ". Convert the checkpoint for this model, or set the model section to the checkpoint's shapes.")
    # One read of the checkpoint for all chunks (several with virtual pipeline stages).
    loaded = load_model_state({str(i): request for i, request in enumerate(requests)}, Path(path))
    for i, (chunk, skip) in enumerate(zip(chunks, skipped)):
        with torch.no_grad():
            result = _unwrap_ddp(chunk).load_state_dict(_strip(loaded[str(i)], prefix), strict=False)
        left = [k for k in result.missing_keys if prefix + k not in skip]
        if result.unexpected_keys or left:
            raise InitCheckpointError(f"loading {path}: unexpected {result.unexpected_keys}, not loaded {left}")
    counts: Dict[str, int] = {}
    for reason in fresh.values():
        counts[reason] = counts.get(reason, 0) + 1
    return {"loaded": len(needed) - len(fresh), "fresh": counts, "keys": sorted(needed - set(fresh))}


def recorded_lora(path: str | Path) -> dict:
    """The rank and alpha the checkpoint's LoRA factors were made with: a converted
    checkpoint's record of its PEFT adapter, or the lora section of the run that saved
    it; {} when neither says."""
    import json

    from orchestrator.plan.checkpoint_dirs import CONVERTED_META

    path = Path(path)
    if (path / CONVERTED_META).is_file():
        return json.loads((path / CONVERTED_META).read_text()).get("lora") or {}
    plan = path.parent.parent / "plan.json"
    if plan.is_file():
        return json.loads(plan.read_text())["config"].get("lora") or {}
    return {}


def load_init_lora(path: str | Path, chunks: Sequence, lora_cfg: dict) -> List[set]:
    """After LoRA is added: load the LoRA factors `path` holds into this rank's chunks
    (collective). Every stored factor must belong to an adapted linear of the same rank,
    and the stored alpha must be lora.alpha; adapted linears without stored factors keep
    their fresh ones. Returns, per chunk, the names of the parameters loaded."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    from orchestrator.train.dist_format import load_model_state, stored_model_tensors
    from orchestrator.train.checkpoint import _unwrap_ddp

    stored = {k: v for k, v in stored_model_tensors(path).items() if ".lora_" in k}
    requests, present, mismatched = [], set(), []
    for chunk in chunks:
        request = {}
        for name, sharded in _flat_sharded(chunk).items():
            if isinstance(sharded, ShardedObject) or ".lora_" not in sharded.key:
                continue
            present.add(sharded.key)
            if sharded.key not in stored:
                continue
            model_shape, stored_shape = _global_shape(sharded), tuple(stored[sharded.key].global_shape)
            if model_shape != stored_shape:
                mismatched.append(f"{sharded.key} (checkpoint {stored_shape}, model {model_shape})")
                continue
            request[name] = sharded
        requests.append(request)
    gathered: List[dict] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"present": present, "mismatched": mismatched,
                                      "loads": {r for q in requests for r in (s.key for s in q.values())}})
    present = set().union(*(g["present"] for g in gathered))
    mismatched = sorted(set().union(*(g["mismatched"] for g in gathered)))
    loads = set().union(*(g["loads"] for g in gathered))
    rank, alpha = int(lora_cfg.get("rank", 0)), float(lora_cfg.get("alpha", 0))
    made = recorded_lora(path)
    problems = []
    extra = sorted(set(stored) - present)
    if extra:
        problems.append(f"it holds LoRA factors of linears this run does not adapt: {_names(extra)} (lora.targets "
                        f"{list(lora_cfg.get('targets') or [])}, lora.encoder {bool(lora_cfg.get('encoder'))}, "
                        f"lora.adapter {bool(lora_cfg.get('adapter'))})")
    if mismatched:
        problems.append(f"their shapes differ (the rank is the factors' inner size; lora.rank={rank}): "
                        f"{_names(mismatched)}")
    if stored and made and float(made.get("alpha", alpha)) / max(1, int(made.get("rank", rank))) != alpha / max(1, rank):
        problems.append(f"they were made with rank {made.get('rank')} and alpha {made.get('alpha')}, this run has "
                        f"lora.rank={rank} lora.alpha={alpha:g}: another scaling (alpha / rank)")
    if problems:
        hint = (f"set lora.rank={made['rank']} lora.alpha={float(made['alpha']):g}" if made.get("rank") else
                "set the lora section to the adapter's rank and alpha")
        raise InitCheckpointError(f"model.init_checkpoint={path}: the LoRA adapter it holds does not fit this run: "
                                  + "; ".join(problems) + f". {hint}, or start LoRA fresh from a checkpoint without it")
    if not loads:
        return [set() for _ in chunks]
    loaded = load_model_state({str(i): request for i, request in enumerate(requests)}, Path(path))
    for i, chunk in enumerate(chunks):
        with torch.no_grad():
            result = _unwrap_ddp(chunk).load_state_dict(loaded[str(i)], strict=False)
        if result.unexpected_keys:
            raise InitCheckpointError(f"loading the LoRA factors of {path}: unexpected {result.unexpected_keys}")
    return [set(request) for request in requests]


def _strip(state: dict, prefix: str) -> dict:
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def describe(path: str | Path, result: dict) -> str:
    """The job's one log line about the initial weights."""
    fresh = ", ".join(f"{reason} ({n} tensors)" for reason, n in sorted(result["fresh"].items()))
    lora = f"; LoRA factors from it: {result['lora_loaded']} tensors" if result.get("lora_loaded") else ""
    return (f"init_checkpoint: loaded {result['loaded']} tensors from {path}{lora}; "
            f"starting fresh: {fresh or 'nothing'}")
