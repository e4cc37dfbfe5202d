"""What the format readers yield, in source order: a Record (one sample to encode) or a
BadRecord (one source entry that cannot become a sample, and why). Every entry of the
source is one or the other and has an index (its position in the source), so chunking
by index is fixed by the source alone, and no entry is dropped without being named.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

# The kinds of bad records, as counted in the import's summary.
BAD_KINDS = {
    "bad_entry": "a manifest line, list line or tar member that cannot be parsed",
    "missing_file": "the audio file does not exist",
    "unreadable_audio": "the audio cannot be decoded",
    "empty_audio": "the audio (or its segment) has no samples, or NaN/infinite ones",
    "offset_beyond_file": "the offset or segment lies outside the audio",
    "no_audio": "a transcript with no audio for it",
    "empty_text": "no transcript, or an empty one",
    "missing_field": "a --keep-field column the record lacks",
}


class SourceError(ValueError):
    """The source cannot be imported at all (missing, not in the format's layout, a flag
    the format does not take): nothing is written."""


@dataclass(frozen=True)
class ReaderOptions:
    text_field: Optional[str] = None  # the transcript's field; None: the format's default
    audio_field: Optional[str] = None  # the audio's field (hf column, wds extension, nemo key)
    keep_fields: Tuple[str, ...] = ()  # more source fields written as str columns
    split: Optional[str] = None  # hf: the DatasetDict split
    audio_root: Optional[str] = None  # nemo, kaldi: the base of relative audio paths


@dataclass(frozen=True)
class AudioRef:
    """Where a record's audio is, and which part of it. One of path (a file), path with
    member (bytes `member = (offset, size)` inside the file, e.g. an uncompressed tar's),
    data (encoded bytes), hf ((dataset dir, split, row, column): read by the worker)."""

    path: Optional[str] = None
    member: Optional[Tuple[int, int]] = None
    data: Optional[bytes] = None
    hf: Optional[Tuple[str, Optional[str], int, str]] = None
    offset: float = 0.0  # seconds from the start of the audio
    duration: Optional[float] = None  # seconds from offset; None: to the end
    # What identifies the audio's content for the chunk digest (set by the reader when the
    # reference itself does not: hf's dataset fingerprint).
    identity: Optional[str] = None

    def describe(self) -> str:
        if self.hf is not None:
            where = f"{self.hf[0]}[{self.hf[1] or ''}] row {self.hf[2]} column {self.hf[3]!r}"
        elif self.member is not None:
            where = f"{self.path} (member at byte {self.member[0]}, {self.member[1]} bytes)"
        elif self.path is not None:
            where = self.path
        else:
            where = f"{len(self.data or b'')} audio bytes"
        return where

    def content_identity(self) -> Any:
        """Cheap evidence of the audio's content: a file's size and modification time (or
        that it is missing), a hash of inline bytes, the reader's identity."""
        if self.identity is not None:
            return self.identity
        if self.data is not None:
            return hashlib.sha1(self.data).hexdigest()
        if self.path is not None:
            try:
                st = os.stat(self.path)
            except OSError as err:
                return f"unreadable: {type(err).__name__}"
            return [st.st_size, st.st_mtime_ns]
        return None


@dataclass
class Record:
    index: int  # position in the source (good and bad entries alike)
    where: str  # the source file and line, or shard and key: for messages and the report
    key: str  # the sample's name in the source (written as the `key` column)
    audio: AudioRef
    text: Any  # the transcript as the source has it (checked by `checked`)
    fields: Dict[str, Any] = field(default_factory=dict)  # the source's other fields


@dataclass
class BadRecord:
    index: int
    where: str
    key: str
    kind: str  # one of BAD_KINDS
    reason: str

    def as_dict(self) -> Dict[str, Any]:
        return {"record": self.index, "where": self.where, "key": self.key, "kind": self.kind, "reason": self.reason}


Item = Union[Record, BadRecord]


def checked(record: Record, keep_fields: Tuple[str, ...], text_name: str) -> Item:
    """The checks every format shares, before any audio is read: a non-empty transcript
    (surrounding white space removed) and every kept field; kept values become strings
    (JSON for what is not one already)."""
    text = record.text
    if text is None:
        return BadRecord(record.index, record.where, record.key, "empty_text", f"no transcript ({text_name})")
    if not isinstance(text, str):
        return BadRecord(record.index, record.where, record.key, "empty_text",
                         f"the transcript ({text_name}) is a {type(text).__name__}, not a string: {text!r:.80}")
    if not text.strip():
        return BadRecord(record.index, record.where, record.key, "empty_text", f"empty transcript ({text_name})")
    missing = [f for f in keep_fields if f not in record.fields]
    if missing:
        return BadRecord(record.index, record.where, record.key, "missing_field",
                         f"no field {', '.join(map(repr, missing))} (--keep-field); it has: "
                         f"{', '.join(sorted(record.fields)) or 'none'}")
    kept = {f: v if isinstance(v, str) else json.dumps(v, sort_keys=True, ensure_ascii=False)
            for f, v in ((f, record.fields[f]) for f in keep_fields)}
    return replace(record, text=text.strip(), fields=kept)


def fingerprint(item: Item) -> str:
    """One line that changes when anything the item's sample depends on changes."""
    if isinstance(item, BadRecord):
        return json.dumps(["bad", item.as_dict()], sort_keys=True)
    a = item.audio
    audio = [a.path, a.member, a.hf, a.offset, a.duration, a.content_identity()]
    return json.dumps(["ok", item.index, item.where, item.key, item.text, item.fields, audio], sort_keys=True,
                      default=str)


def resolve(path: str, base: Path) -> str:
    """A path as a manifest writes it -> an absolute path (relative ones from `base`)."""
    p = Path(os.path.expanduser(path))
    return str(p if p.is_absolute() else base / p)
