"""Read and write HF checkpoint directories (config.json + safetensors, single or sharded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

SHARD_BYTES = 5 * 1024**3


def read_hf_config(hf_dir: Path) -> dict:
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: --hf must be a HF checkpoint directory (config.json + *.safetensors)")
    return json.loads(path.read_text())


def _safetensors_files(hf_dir: Path) -> List[Path]:
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in hf_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {hf_dir} (pytorch_model.bin checkpoints are not read; "
                                "re-save with save_pretrained(safe_serialization=True))")
    return [hf_dir / name for name in files]


# safetensors header dtype names -> torch's
_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


class SafetensorsDir:
    """The tensors of a safetensors directory (single file or sharded), each file opened
    once and each tensor read on access, so a conversion holds only what it has
    converted so far."""

    def __init__(self, hf_dir: Path):
        self.dir = Path(hf_dir)
        self._where = {}  # tensor name -> the open file holding it
        for path in _safetensors_files(self.dir):
            handle = safe_open(str(path), framework="pt")
            self._where.update({name: handle for name in handle.keys()})

    def names(self) -> List[str]:
        return list(self._where)

    def __iter__(self):
        return iter(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"{self.dir} has no tensor {name!r}")
        return self._where[name].get_tensor(name)

    def dtype_name(self) -> str:
        """The dtype of the first tensor, from the file header (no tensor is read)."""
        name = next(iter(self._where))
        stored = self._where[name].get_slice(name).get_dtype()
        return _DTYPES.get(stored, stored.lower())


class TensorsUnder:
    """The tensors of a SafetensorsDir whose names start with `prefix`, named without it
    (one part of an AudioLLM model directory: `language_model.`, `encoder.`, `adapter.`)."""

    def __init__(self, source: SafetensorsDir, prefix: str):
        self.source, self.prefix = source, prefix
        self._names = [n[len(prefix):] for n in source.names() if n.startswith(prefix)]

    def names(self) -> List[str]:
        return list(self._names)

    def __iter__(self):
        return iter(self._names)

    def __contains__(self, name: str) -> bool:
        return self.prefix + name in self.source

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.source[self.prefix + name]

    def dtype_name(self) -> str:
        name = self.prefix + self._names[0]
        stored = self.source._where[name].get_slice(name).get_dtype()
        return _DTYPES.get(stored, stored.lower())


def read_hf_state_dict(hf_dir: Path) -> Dict[str, torch.Tensor]:
    state: Dict[str, torch.Tensor] = {}
    for path in _safetensors_files(Path(hf_dir)):
        state.update(load_file(str(path)))
    return state


def write_hf_checkpoint(out_dir: Path, state: Dict[str, torch.Tensor], config_text: Optional[str]) -> None:
    """config.json verbatim (unless None) and the tensors as safetensors (sharded above 5 GiB)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if config_text is not None:
        (out_dir / "config.json").write_text(config_text)
    state = {k: v.contiguous() for k, v in state.items()}
    total = sum(t.numel() * t.element_size() for t in state.values())
    if total <= SHARD_BYTES:
        save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    shards, current, size = [], {}, 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > SHARD_BYTES:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += nbytes
    shards.append(current)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
