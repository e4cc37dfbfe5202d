"""`audiollm data show DIR`: what an MDS dataset holds, for a look before training on it.

DIR is one dataset (a directory with index.json) or a directory with datasets below it
(the demo corpus, a folder of imports): for each, its sample count, shards, columns and
hours of audio, the import's summary when `audiollm data import` wrote it, and its first
samples (text, duration, the audio's rate and encoding, the other columns). Samples are
read with mosaic's own shard reader, as training reads them, without its shared memory.
Hours come from import.json when there is one, else from every sample's `duration`
column (or its audio header).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

from orchestrator.data.importing.writer import STATE

_SHOWN_CHARS = 160


def find_datasets(root: Path) -> List[Path]:
    if (root / "index.json").is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    found = sorted(p.parent for p in root.rglob("index.json") if STATE not in p.parts)
    if not found:
        raise FileNotFoundError(f"{root} holds no MDS dataset (no index.json in it or below it)")
    return found


def _samples(path: Path, shards: List[Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
    from streaming.base.format import reader_from_json

    for shard in shards:
        reader = reader_from_json(str(path), None, shard)
        for i in range(reader.samples):
            yield reader.get_item(i)


def _audio_info(data: Any) -> Tuple[str, float]:
    import soundfile as sf

    if not isinstance(data, (bytes, bytearray)):
        return f"{type(data).__name__} (not encoded bytes)", float("nan")
    try:
        info = sf.info(io.BytesIO(bytes(data)))
    except Exception as err:  # libsndfile's several error types: all mean "not decodable"
        return f"{len(data)} bytes that do not decode ({err})", float("nan")
    return f"{info.samplerate} Hz, {info.channels} ch, {info.format} {info.subtype}", info.frames / info.samplerate


def _shown(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    if hasattr(value, "shape") and getattr(value, "shape", ()) != ():
        return f"<array {tuple(value.shape)} {value.dtype}>"
    text = value if isinstance(value, str) else repr(value.item() if hasattr(value, "item") else value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + f"... ({len(text)} chars)"


def describe_dataset(path: Path, samples: int = 3, audio_field: str = "audio",
                     text_field: str = "text") -> Dict[str, Any]:
    index = json.loads((path / "index.json").read_text())
    shards = [s for s in index["shards"] if s["samples"] > 0]
    columns = dict(zip(shards[0]["column_names"], shards[0]["column_encodings"])) if shards else {}
    info: Dict[str, Any] = {"path": str(path), "samples": sum(s["samples"] for s in shards), "shards": len(shards),
                            "bytes": sum(s["raw_data"]["bytes"] for s in shards), "columns": columns, "examples": []}
    imported = path / "import.json"
    info["import"] = json.loads(imported.read_text()) if imported.is_file() else None
    total, low, high = 0.0, None, None
    scan = info["import"] is None
    for i, sample in enumerate(_samples(path, shards) if (scan or samples) else ()):
        if i >= samples and not scan:
            break
        audio_desc, seconds = _audio_info(sample.get(audio_field))
        if "duration" in sample:
            seconds = float(sample["duration"])
        if i < samples:
            info["examples"].append({"seconds": seconds, "audio": audio_desc,
                                     "text": _shown(sample.get(text_field)),
                                     "fields": {k: _shown(v) for k, v in sorted(sample.items())
                                                if k not in (audio_field, text_field, "duration")}})
        if scan:
            total += seconds
            low = seconds if low is None else min(low, seconds)
            high = seconds if high is None else max(high, seconds)
    if scan:
        info["seconds"], info["min_seconds"], info["max_seconds"] = total, low, high
    else:
        imp = info["import"]
        info["seconds"], info["min_seconds"], info["max_seconds"] = (imp["audio_seconds"], imp["min_seconds"],
                                                                     imp["max_seconds"])
    return info


def format_dataset(info: Dict[str, Any]) -> str:
    cols = ", ".join(f"{k} ({v})" for k, v in info["columns"].items())
    lines = [f"{info['path']}: {info['samples']} samples in {info['shards']} shards, "
             f"{info['bytes'] / 1e9:.3f} GB; columns: {cols or 'none'}"]
    span = (f", clips {info['min_seconds']:.2f}-{info['max_seconds']:.2f} s" if info["min_seconds"] is not None
            else "")
    lines.append(f"  {info['seconds'] / 3600:.3f} h of audio{span}"
                 + (" (from import.json)" if info["import"] else ""))
    imp = info["import"]
    if imp:
        p = imp["params"]
        kinds = ", ".join(f"{n} {k}" for k, n in imp["bad_by_kind"].items())
        lines.append(f"  imported from {p['format']} {p['source']}: {imp['records']} records, {imp['bad']} bad"
                     + (f" ({kinds}; see {Path(info['path']) / 'bad_records.jsonl'})" if imp["bad"] else ""))
    for i, ex in enumerate(info["examples"]):
        lines.append(f"  sample {i}: {ex['seconds']:.2f} s, {ex['audio']}")
        lines.append(f"    text: {ex['text']}")
        for k, v in ex["fields"].items():
            lines.append(f"    {k}: {v}")
    return "\n".join(lines)


def show(root: str | Path, samples: int = 3, audio_field: str = "audio", text_field: str = "text") -> str:
    datasets = find_datasets(Path(root))
    infos = [describe_dataset(p, samples, audio_field, text_field) for p in datasets]
    out = [format_dataset(i) for i in infos]
    if len(infos) > 1:
        out.append(f"{len(infos)} datasets: {sum(i['samples'] for i in infos)} samples, "
                   f"{sum(i['seconds'] for i in infos) / 3600:.3f} h of audio")
    return "\n".join(out)
