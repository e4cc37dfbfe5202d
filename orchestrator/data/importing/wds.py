"""WebDataset tar shards -> records, read with the standard library's tarfile.

SRC: one .tar (or .tar.gz / .tgz), a directory of them (sorted by name), or a glob.
Members are grouped into samples as WebDataset does: the key is the member's path up
to the first dot of its file name (`utt/0001.flac` -> key `utt/0001`, extension
`flac`), and consecutive members with one key are one sample. A sample needs one
audio member (flac, wav, mp3, ogg, opus; --audio-field EXT picks one of several) and a
transcript: --text-field names a member extension or a key of the sample's .json;
without it, the .txt member, else the .json's "text". The .json's keys are the fields
--keep-field can keep.

Audio of an uncompressed tar is not read here: the record points at the member's bytes
in the file and the encoding worker reads them. A compressed tar can only be read
from its start, so its audio bytes travel with the record (a chunk of records in memory).
"""

from __future__ import annotations

import glob
import json
import re
import tarfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

from orchestrator.data.importing.records import AudioRef, BadRecord, Item, ReaderOptions, Record, SourceError

AUDIO_EXTENSIONS = ("flac", "wav", "mp3", "ogg", "opus")
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def text_source(opts: ReaderOptions) -> str:
    return (f"member or .json key {opts.text_field!r}" if opts.text_field
            else "the .txt member, else the .json's 'text'")


def read(src: str, opts: ReaderOptions) -> Iterator[Item]:
    if opts.split is not None:
        raise SourceError(f"--split ({opts.split}) is for the hf format; WebDataset shards have no splits")
    if opts.audio_root is not None:
        raise SourceError("--audio-root does not apply to WebDataset shards: their audio is inside the tars")
    shards = _shards(src)
    return _records(shards, opts)


def _shards(src: str) -> List[Path]:
    p = Path(src)
    if p.is_dir():
        shards = sorted(q for q in p.iterdir() if q.name.endswith(_TAR_SUFFIXES) and q.is_file())
        if not shards:
            raise SourceError(f"directory {p} holds no tar shards ({', '.join(_TAR_SUFFIXES)})")
        return shards
    if p.is_file():
        return [p]
    shards = sorted(Path(q) for q in glob.glob(src) if Path(q).is_file())
    if not shards:
        raise SourceError(f"no WebDataset shard matches {src}: give a .tar file, a directory of them or a glob "
                          f"such as 'shards/train-*.tar'")
    return shards


def _members(shard: Path) -> Iterator[Tuple[str, tarfile.TarInfo, object]]:
    """(name, member, opened tar) per regular member, in the tar's order."""
    try:
        tar = tarfile.open(shard, mode="r:")  # uncompressed: random access to each member's bytes
        compressed = False
    except tarfile.ReadError:
        try:
            tar = tarfile.open(shard, mode="r|*")
        except tarfile.ReadError as err:
            raise SourceError(f"{shard} is not a tar archive ({err})") from None
        compressed = True
    with tar:
        last = None
        members = iter(tar)
        while True:
            try:
                member = next(members)
            except StopIteration:
                return
            except (tarfile.TarError, OSError, EOFError) as err:
                raise SourceError(f"{shard} is damaged after member {last or '(none)'}: {err}; rewrite the "
                                  f"shard or leave it out of SRC") from None
            last = member.name
            if member.isfile():
                yield member.name, member, (tar, compressed)


def _records(shards: List[Path], opts: ReaderOptions) -> Iterator[Item]:
    index = 0
    for shard in shards:
        key: Optional[str] = None
        sample: Dict[str, Tuple[tarfile.TarInfo, object]] = {}
        for name, member, (tar, compressed) in _members(shard):
            m = _KEY_EXT.match(name)
            if m is None:
                yield BadRecord(index, f"{shard}:{name}", name, "bad_entry",
                                f"tar member {name} has no extension, so it belongs to no sample")
                index += 1
                continue
            member_key, ext = m.group(1), m.group(2)
            if key is not None and (member_key != key or ext in sample):
                yield _sample(index, shard, key, sample, opts)
                index += 1
                sample = {}
            key = member_key
            # Small members (transcripts, json) and a compressed tar's audio are read now:
            # a compressed tar cannot be read at an offset later.
            is_audio = ext.rsplit(".", 1)[-1].lower() in AUDIO_EXTENSIONS
            if is_audio and not compressed:
                sample[ext] = (member, AudioRef(path=str(shard), member=(member.offset_data, member.size)))
            else:
                try:
                    f = tar.extractfile(member)
                    data = f.read() if f is not None else b""
                except Exception as err:  # a damaged compressed stream: zlib, lzma, EOF errors
                    raise SourceError(f"{shard} is damaged at member {name}: {type(err).__name__}: {err}; "
                                      f"rewrite the shard or leave it out of SRC") from None
                sample[ext] = (member, AudioRef(data=data) if is_audio else data)
        if key is not None:
            yield _sample(index, shard, key, sample, opts)
            index += 1


def _sample(index: int, shard: Path, key: str, sample: Dict[str, Tuple[tarfile.TarInfo, object]],
            opts: ReaderOptions) -> Item:
    where = f"{shard}:{key}"
    have = ", ".join(sorted(sample))

    def bad(kind: str, reason: str) -> BadRecord:
        return BadRecord(index, where, key, kind, reason)

    fields: Dict[str, object] = {}
    if "json" in sample:
        try:
            meta = json.loads(sample["json"][1])
        except (ValueError, UnicodeDecodeError) as err:
            return bad("bad_entry", f"{key}.json is not JSON ({err})")
        if not isinstance(meta, dict):
            return bad("bad_entry", f"{key}.json is a JSON {type(meta).__name__}, not an object")
        fields.update(meta)
    texts = {}
    for ext in sample:
        if ext.rsplit(".", 1)[-1].lower() in ("txt", "text"):
            try:
                texts[ext] = sample[ext][1].decode("utf-8")
            except UnicodeDecodeError as err:
                return bad("bad_entry", f"{key}.{ext} is not UTF-8 text ({err})")
    fields.update(texts)
    audio_exts = [e for e in sample if e.rsplit(".", 1)[-1].lower() in AUDIO_EXTENSIONS]
    if opts.audio_field:
        if opts.audio_field not in sample:
            return bad("no_audio", f"no .{opts.audio_field} member (--audio-field); the sample has: {have}")
        audio_ext = opts.audio_field
    elif len(audio_exts) == 1:
        audio_ext = audio_exts[0]
    elif not audio_exts:
        return bad("no_audio", f"no audio member ({', '.join(AUDIO_EXTENSIONS)}); the sample has: {have}")
    else:
        return bad("no_audio", f"{len(audio_exts)} audio members ({', '.join(audio_exts)}): choose one with "
                               f"--audio-field")
    audio = sample[audio_ext][1]
    if not isinstance(audio, AudioRef):  # --audio-field named a member of another type
        audio = AudioRef(data=audio)
    if opts.text_field:
        text = fields.get(opts.text_field)
    else:
        text = texts.get("txt", fields.get("text"))
    return Record(index, where, key, audio, text, fields)
