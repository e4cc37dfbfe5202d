"""NeMo JSONL manifest -> records.

One JSON object a line: `audio_filepath`, `text`, `duration` (seconds), optional
`offset` (seconds): the clip is [offset, offset + duration) of the file, as NeMo's
audio datasets read it. Relative paths are resolved against the manifest's directory
(NeMo's own rule), or against --audio-root. Blank lines are not entries; every other
line is one record, good or bad, its `where` the manifest and line number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterator

from orchestrator.data.importing.records import AudioRef, BadRecord, Item, ReaderOptions, Record, SourceError, resolve

AUDIO_KEY = "audio_filepath"
TEXT_KEY = "text"


def text_source(opts: ReaderOptions) -> str:
    return f"field {opts.text_field or TEXT_KEY!r}"


def read(src: str, opts: ReaderOptions) -> Iterator[Item]:
    manifest = Path(src)
    if opts.split is not None:
        raise SourceError(f"--split ({opts.split}) is for the hf format; a NeMo manifest has no splits")
    if not manifest.exists() or manifest.is_dir():
        raise SourceError(f"NeMo manifest {manifest} is not a file; give the JSONL manifest "
                          f"(one JSON object per line with {AUDIO_KEY}, duration, {TEXT_KEY})")
    base = Path(opts.audio_root) if opts.audio_root else manifest.resolve().parent
    audio_key = opts.audio_field or AUDIO_KEY
    text_key = opts.text_field or TEXT_KEY
    return _records(manifest, base, audio_key, text_key)


def _records(manifest: Path, base: Path, audio_key: str, text_key: str) -> Iterator[Item]:
    index = 0
    with open(manifest, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{manifest}:{lineno}"
            yield _record(index, where, line, base, audio_key, text_key)
            index += 1


def _record(index: int, where: str, line: str, base: Path, audio_key: str, text_key: str) -> Item:
    def bad(reason: str, key: str = "") -> BadRecord:
        return BadRecord(index, where, key, "bad_entry", reason)

    try:
        entry = json.loads(line)
    except ValueError as err:
        return bad(f"not JSON ({err}): {line.strip()[:120]}")
    if not isinstance(entry, dict):
        return bad(f"a JSON {type(entry).__name__}, not an object: {line.strip()[:120]}")
    path = entry.get(audio_key)
    if not isinstance(path, str) or not path:
        return bad(f"no {audio_key!r} path (keys: {', '.join(sorted(entry)) or 'none'})")
    times = {}
    for name in ("offset", "duration"):
        value = entry.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            return bad(f"{name} must be a number of seconds >= 0, got {value!r}", path)
        times[name] = float(value)
    if times.get("duration") == 0:
        return BadRecord(index, where, path, "empty_audio", "duration is 0 s")
    key = path if "offset" not in entry else f"{path}@{times['offset']:g}"
    audio = AudioRef(path=resolve(path, base), offset=times.get("offset", 0.0), duration=times.get("duration"))
    fields = {k: v for k, v in entry.items() if k not in (audio_key, text_key, "offset", "duration")}
    return Record(index, where, key, audio, entry.get(text_key), fields)
