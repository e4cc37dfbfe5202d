"""Kaldi data directory -> records.

    wav.scp   <recording-id> <audio file path>
    text      <utterance-id> <transcript words ...>
    segments  <utterance-id> <recording-id> <start s> <end s>   (optional; end -1: to the end)
    utt2spk   <utterance-id> <speaker-id>                       (optional: the `speaker` field)

Without segments every recording is one utterance of the same id. Records come in the
order of segments (else wav.scp), then one bad record for each transcript in `text`
whose utterance has no audio. Relative paths are resolved against --audio-root, else the
current directory (Kaldi tools read them from the recipe directory they run in); where
the first relative path is not found from the current directory and no --audio-root is
given, the import is refused, naming the directories it is found from.
wav.scp entries that are commands (`... |`) or archive offsets (`foo.ark:123`) are not
read here: the import is refused, naming the first such line and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

from orchestrator.data.importing.records import AudioRef, BadRecord, Item, ReaderOptions, Record, SourceError, resolve

_ARK_OFFSET = re.compile(r"\.ark:\d+$")


def text_source(opts: ReaderOptions) -> str:
    return "the data directory's `text` file"


def read(src: str, opts: ReaderOptions) -> Iterator[Item]:
    d = Path(src)
    given = [f for f, v in (("--text-field", opts.text_field), ("--audio-field", opts.audio_field),
                            ("--split", opts.split)) if v is not None]
    if given:
        raise SourceError(f"{', '.join(given)} do not apply to a Kaldi data directory: its transcripts are in "
                          f"{d}/text and its audio in {d}/wav.scp (and segments)")
    if not d.is_dir():
        raise SourceError(f"Kaldi data directory {d} is not a directory (it holds wav.scp and text)")
    missing = [n for n in ("wav.scp", "text") if not (d / n).is_file()]
    if missing:
        raise SourceError(f"Kaldi data directory {d} has no {' or '.join(missing)}; it needs wav.scp "
                          f"(<recording-id> <path>) and text (<utterance-id> <words>)")
    base = Path(opts.audio_root) if opts.audio_root else Path.cwd()
    if not opts.audio_root:
        _check_relative_paths(d)
    recordings = _wav_scp(d / "wav.scp", base)
    texts = _table(d / "text", allow_empty=True)
    speakers = _table(d / "utt2spk") if (d / "utt2spk").is_file() else {}
    return _records(d, recordings, texts, speakers)


def _check_relative_paths(d: Path) -> None:
    """Refuse relative wav.scp paths that the current directory does not resolve: each of
    the data directory's recordings would be named missing, one by one."""
    for lineno, line in _lines(d / "wav.scp"):
        parts = line.strip().split(maxsplit=1)
        if len(parts) < 2 or Path(parts[1]).is_absolute() or parts[1].endswith("|") or _ARK_OFFSET.search(parts[1]):
            continue
        if (Path.cwd() / parts[1]).exists():
            return
        found = [str(p) for p in (d, d.parent, d.parent.parent) if (p / parts[1]).exists()]
        raise SourceError(
            f"{d / 'wav.scp'}:{lineno}: recording {parts[0]}'s path {parts[1]} is relative and not found from the "
            f"current directory {Path.cwd()} (Kaldi tools read such paths from the recipe directory they run in): "
            f"pass --audio-root DIR, the directory they are relative to"
            + (f"; it is found from {' and '.join(found)}" if found else ""))


def _lines(path: Path) -> Iterator[Tuple[int, str]]:
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                yield lineno, line.rstrip("\n")


def _table(path: Path, allow_empty: bool = False) -> Dict[str, Tuple[str, int]]:
    """<id> <value...> lines -> {id: (value, line)}; a repeated id refuses the import
    (which line to believe is the data directory's author's call)."""
    out: Dict[str, Tuple[str, int]] = {}
    for lineno, line in _lines(path):
        parts = line.strip().split(maxsplit=1)
        value = parts[1].strip() if len(parts) > 1 else ""
        if parts[0] in out:
            raise SourceError(f"{path}:{lineno}: id {parts[0]} repeats line {out[parts[0]][1]}; "
                              f"each id must appear once (utils/fix_data_dir.sh removes duplicates)")
        if not value and not allow_empty:
            raise SourceError(f"{path}:{lineno}: id {parts[0]} has no value")
        out[parts[0]] = (value, lineno)
    return out


def _wav_scp(path: Path, base: Path) -> Dict[str, Tuple[Optional[str], int]]:
    """{recording: (absolute path or None when the line has none, line)}."""
    table = _table(path, allow_empty=True)
    unsupported = [(lineno, rec, value) for rec, (value, lineno) in table.items()
                   if value.endswith("|") or _ARK_OFFSET.search(value)]
    if unsupported:
        lineno, rec, value = unsupported[0]
        kind = "a command" if value.endswith("|") else "an archive offset"
        raise SourceError(
            f"{path}:{lineno}: recording {rec} is {kind} ({value!r}); {len(unsupported)} of {len(table)} "
            f"wav.scp entries are commands or archive offsets, and the import reads audio files only. "
            f"Write each recording to a file first, e.g. with Kaldi's wav-copy (it reads both): "
            f"`mkdir -p wav; while read -r id entry; do wav-copy \"$entry\" wav/$id.wav; done < {path}`, "
            f"then list '<recording-id> wav/<recording-id>.wav' lines in wav.scp")
    return {rec: ((resolve(value, base) if value else None), lineno) for rec, (value, lineno) in table.items()}


def _records(d: Path, recordings, texts, speakers) -> Iterator[Item]:
    index = 0
    seen: Dict[str, str] = {}
    segments = d / "segments"
    if segments.is_file():
        entries = ((f"{segments}:{lineno}", line) for lineno, line in _lines(segments))
    else:
        entries = ((f"{d / 'wav.scp'}:{lineno}", f"{rec} {rec} 0 -1")
                   for rec, (_, lineno) in sorted(recordings.items(), key=lambda kv: kv[1][1]))
    for where, line in entries:
        yield _segment(index, where, line, d, recordings, texts, speakers, seen)
        index += 1
    why = "no line in segments" if segments.is_file() else "no recording of that id in wav.scp"
    for utt, (_, lineno) in sorted(texts.items(), key=lambda kv: kv[1][1]):
        if utt not in seen:
            yield BadRecord(index, f"{d / 'text'}:{lineno}", utt, "no_audio",
                            f"utterance {utt} has a transcript but no audio ({why})")
            index += 1


def _segment(index: int, where: str, line: str, d: Path, recordings, texts, speakers, seen: Dict[str, str]) -> Item:
    parts = line.split()
    utt = parts[0]
    if utt in seen:
        return BadRecord(index, where, utt, "bad_entry", f"utterance {utt} repeats {seen[utt]}")
    seen[utt] = where  # its transcript is this record's, whatever becomes of it
    if len(parts) != 4:
        return BadRecord(index, where, utt, "bad_entry",
                         f"expected '<utterance-id> <recording-id> <start> <end>', got {line.strip()!r}")
    _, rec, start_s, end_s = parts
    try:
        start, end = float(start_s), float(end_s)
    except ValueError:
        return BadRecord(index, where, utt, "bad_entry", f"start {start_s!r} and end {end_s!r} must be seconds")
    if start < 0 or (end != -1 and end <= start):
        return BadRecord(index, where, utt, "bad_entry",
                         f"segment [{start_s}, {end_s}] s is empty or negative (end -1 means: to the end)")
    if rec not in recordings:
        return BadRecord(index, where, utt, "no_audio", f"recording {rec} is not in {d / 'wav.scp'}")
    path, scp_line = recordings[rec]
    if path is None:
        return BadRecord(index, where, utt, "bad_entry", f"{d / 'wav.scp'}:{scp_line}: recording {rec} has no path")
    text = texts[utt][0] if utt in texts else None
    fields: Dict[str, object] = {"speaker": speakers[utt][0]} if utt in speakers else {}
    audio = AudioRef(path=path, offset=start, duration=None if end == -1 else end - start)
    return Record(index, where, utt, audio, text, fields)

