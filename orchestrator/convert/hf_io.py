"""Read and write HF checkpoint directories (config.json + safetensors, single or sharded)."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Dict, List, Optional

import torch
from safetensors import safe_open
from safetensors.torch import load_file

# Shards of 2 GiB (HF's save_pretrained makes 5 GB ones): an export holds the shard it is
# writing, so this bounds its memory, with one layer's tensors, at any model size.
SHARD_BYTES = 2 * 1024**3


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
    (one part of an AudioLLM model directory: `language_model.`, `encoder.`, `adapter.`),
    or with `prefix` replaced by `renamed`."""

    def __init__(self, source: SafetensorsDir, prefix: str, renamed: str = ""):
        self.source, self.prefix, self.renamed = source, prefix, renamed
        self._names = [renamed + n[len(prefix):] for n in source.names() if n.startswith(prefix)]

    def _stored(self, name: str) -> str:
        return self.prefix + name[len(self.renamed):]

    def names(self) -> List[str]:
        return list(self._names)

    def __iter__(self):
        return iter(self._names)

    def __contains__(self, name: str) -> bool:
        return name.startswith(self.renamed) and self._stored(name) in self.source

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.source[self._stored(name)]

    def dtype_name(self) -> str:
        name = self._stored(self._names[0])
        stored = self.source._where[name].get_slice(name).get_dtype()
        return _DTYPES.get(stored, stored.lower())


class JoinedTensors:
    """Several views (TensorsUnder) read as one: a released speech LLM's language model, its
    layers under one prefix and its output layer under another."""

    def __init__(self, *views: TensorsUnder):
        self.views = views
        self._names = [name for view in views for name in view.names()]

    def names(self) -> List[str]:
        return list(self._names)

    def __iter__(self):
        return iter(self._names)

    def __contains__(self, name: str) -> bool:
        return any(name in view for view in self.views)

    def __getitem__(self, name: str) -> torch.Tensor:
        for view in self.views:
            if name in view:
                return view[name]
        raise KeyError(name)

    def dtype_name(self) -> str:
        return self.views[0].dtype_name()


def under_first(source: SafetensorsDir, prefixes, renamed: str = "") -> Optional[TensorsUnder]:
    """The tensors under the first of `prefixes` that holds any (renamed), or None."""
    for prefix in prefixes:
        view = TensorsUnder(source, prefix, renamed)
        if view.names():
            return view
    return None


def read_hf_state_dict(hf_dir: Path) -> Dict[str, torch.Tensor]:
    state: Dict[str, torch.Tensor] = {}
    for path in _safetensors_files(Path(hf_dir)):
        state.update(load_file(str(path)))
    return state


_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                      torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                      torch.bool: "BOOL"}


def save_safetensors(tensors: Dict[str, torch.Tensor], path: Path) -> None:
    """The safetensors format (an 8-byte header length, the JSON header, the tensors' bytes
    back to back), written from each tensor's own memory: safetensors' save_file first
    copies every tensor into a bytes object, twice a shard's memory at its peak."""
    if sys.byteorder != "little":
        raise RuntimeError("safetensors stores little-endian data; this machine is big-endian")
    header, offset = {}, 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for tensor in tensors.values():
            out.write(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)


class ShardWriter:
    """Safetensors written as the tensors come: each shard is saved once it would pass
    `shard_bytes` (default SHARD_BYTES), so a writer holds at most one shard's tensors (an
    export streams a checkpoint through it). close() names the shards as HF does:
    model.safetensors when there is one, else model-0000i-of-0000N.safetensors with
    model.safetensors.index.json."""

    def __init__(self, out_dir: Path, shard_bytes: Optional[int] = None):
        self.dir, self.shard_bytes = Path(out_dir), shard_bytes or SHARD_BYTES
        self.dir.mkdir(parents=True, exist_ok=True)
        # A model written here before may have had another number of shards: its files
        # would be read with these (an index naming old shards, or model.safetensors beside one).
        for old in [*self.dir.glob("model*.safetensors"), self.dir / "model.safetensors.index.json"]:
            old.unlink(missing_ok=True)
        self._current: Dict[str, torch.Tensor] = {}
        self._size = self.total = 0
        self._shards: List[List[str]] = []  # the names in each shard saved so far
        self._closed = False

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self._current and self._size + nbytes > self.shard_bytes:
            self._save()
        self._current[name] = tensor
        self._size += nbytes
        self.total += nbytes

    def _save(self) -> None:
        save_safetensors(self._current, self._part(len(self._shards)))
        self._shards.append(list(self._current))
        self._current, self._size = {}, 0

    def _part(self, index: int) -> Path:
        return self.dir / f"model-part-{index + 1:05d}.safetensors"

    def close(self) -> int:
        """Saves what is left and names the shards; returns the bytes written. Closing
        again does nothing."""
        if self._closed:
            return self.total
        self._closed = True
        if not self._shards:
            save_safetensors(self._current, self.dir / "model.safetensors")
            self._current = {}
            return self.total
        if self._current:
            self._save()
        count, weight_map = len(self._shards), {}
        for i, names in enumerate(self._shards):
            fname = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
            self._part(i).rename(self.dir / fname)
            weight_map.update({name: fname for name in names})
        (self.dir / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": self.total}, "weight_map": weight_map}, indent=2))
        return self.total


# Multimodal HF checkpoints whose language model is a decoder family's: config.json's
# model_type -> (the key of its text config, where its decoder's tensors are stored, as
# transformers 4 writes them and as 5 does). Gemma 3 from 4b up is one
# (Gemma3ForConditionalGeneration); its vision tower is left out.
MULTIMODAL_DECODERS = {"gemma3": ("text_config", ("language_model.model.", "model.language_model."))}


def multimodal_decoder(config_dict: dict, source: SafetensorsDir):
    """(the decoder's config.json dict, its tensors named as the text model's: model.*) of a
    multimodal checkpoint (MULTIMODAL_DECODERS), or None for any other."""
    known = MULTIMODAL_DECODERS.get(config_dict.get("model_type"))
    if known is None:
        return None
    key, prefixes = known
    for prefix in prefixes:
        tensors = TensorsUnder(source, prefix, renamed="model.")
        if tensors.names():
            return config_dict[key], tensors
    raise ValueError(f"the {config_dict.get('model_type')} checkpoint holds no language-model tensors under "
                     f"{' or '.join(prefixes)}")

