"""HF `datasets` directory (`Dataset.save_to_disk` / `DatasetDict.save_to_disk`) -> records.

Read with `datasets.load_from_disk` (memory-mapped Arrow files; imported only here, and
only when this format is used). A DatasetDict needs --split unless it has one split.
The audio column (--audio-field, default "audio") is an `Audio` feature, read
undecoded: its stored bytes, or the file its path names when it stores none; or a
binary column of encoded audio. The transcript column is --text-field (default "text").

Only the transcript and kept columns are read here; each worker process opens the
dataset itself (memory-mapped, cheap) and reads its records' audio by row, so the
audio does not pass through this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

from orchestrator.data.importing.records import AudioRef, Item, ReaderOptions, Record, SourceError

# The hf extra's requirement (pyproject.toml; tests/test_packaging.py keeps them equal).
DATASETS_REQUIREMENT = "datasets>=4,<5.1"
AUDIO_COLUMN = "audio"
TEXT_COLUMN = "text"
_BATCH = 1000  # rows per Arrow read of the transcripts


def text_source(opts: ReaderOptions) -> str:
    return f"column {opts.text_field or TEXT_COLUMN!r}"


def _datasets():
    try:
        import datasets
    except ImportError:
        raise SourceError(f"the hf format reads with the `datasets` package, which is not installed: install the "
                          f"project's hf extra (`bash setup.sh --hf`, or `pip install -e '.[hf]'` in the checkout), "
                          f"or `pip install '{DATASETS_REQUIREMENT}'`") from None
    return datasets


def open_split(src: str, split: Optional[str]):
    """(Dataset, split name or None) of a save_to_disk directory."""
    datasets = _datasets()
    try:
        loaded = datasets.load_from_disk(src)
    except FileNotFoundError as err:
        raise SourceError(f"{src} is not a directory written by Dataset.save_to_disk or "
                          f"DatasetDict.save_to_disk ({err})") from None
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if split is None:
            if len(splits) != 1:
                raise SourceError(f"{src} holds splits {', '.join(splits)}: choose one with --split")
            split = splits[0]
        if split not in loaded:
            raise SourceError(f"{src} has no split {split!r}; it has: {', '.join(splits)}")
        return loaded[split], split
    if split is not None and split != (str(loaded.split) if loaded.split is not None else None):
        raise SourceError(f"{src} is one Dataset (split {loaded.split}), not a DatasetDict: leave out --split "
                          f"({split})")
    return loaded, (str(loaded.split) if loaded.split is not None else None)


def _audio_kind(ds, column: str, src: str) -> str:
    datasets = _datasets()
    feature = ds.features[column]
    if isinstance(feature, datasets.Audio):
        return "audio"
    if isinstance(feature, datasets.Value) and feature.dtype in ("binary", "large_binary"):
        return "bytes"
    raise SourceError(f"column {column!r} of {src} is {feature}, not an Audio feature or encoded audio bytes; "
                      f"name the audio column with --audio-field")


def read(src: str, opts: ReaderOptions) -> Iterator[Item]:
    if opts.audio_root is not None:
        raise SourceError("--audio-root does not apply to a HF dataset: its audio is in the dataset")
    ds, split = open_split(src, opts.split)
    audio_col, text_col = opts.audio_field or AUDIO_COLUMN, opts.text_field or TEXT_COLUMN
    columns = list(ds.column_names)
    missing = [f"{c!r} ({flag})" for c, flag in [(audio_col, "--audio-field"), (text_col, "--text-field")]
               + [(k, "--keep-field") for k in opts.keep_fields] if c not in columns]
    if missing:
        raise SourceError(f"{src}{f' split {split}' if split else ''} has no column {', '.join(missing)}; "
                          f"its columns: {', '.join(columns)}")
    _audio_kind(ds, audio_col, src)
    return _records(ds, str(Path(src).resolve()), split, audio_col, text_col, opts.keep_fields)


def _records(ds, src: str, split: Optional[str], audio_col: str, text_col: str, keep) -> Iterator[Item]:
    identity = f"hf:{ds._fingerprint}"  # changes whenever the dataset's content does
    read_cols = [text_col] + [k for k in keep if k != text_col]
    row = 0
    for batch in ds.select_columns(read_cols).iter(batch_size=_BATCH):
        for i in range(len(batch[text_col])):
            audio = AudioRef(hf=(src, split, row, audio_col), identity=identity)
            fields = {k: batch[k][i] for k in keep}
            yield Record(row, f"{src}[{split or ''}]:{row}", f"{split}/{row}" if split else str(row), audio,
                         batch[text_col][i], fields)
            row += 1


_OPENED: Dict[Tuple[str, Optional[str], str], Any] = {}


def fetch(ref: AudioRef) -> AudioRef:
    """A worker's read of one row's audio: its bytes, or the file its path names."""
    src, split, row, column = ref.hf
    key = (src, split, column)
    if key not in _OPENED:
        datasets = _datasets()
        ds, _ = open_split(src, split)
        ds = ds.select_columns([column])
        if _audio_kind(ds, column, src) == "audio":
            ds = ds.cast_column(column, datasets.Audio(decode=False))  # the stored bytes, undecoded
        _OPENED[key] = ds
    value = _OPENED[key][row][column]
    if isinstance(value, dict):
        if value.get("bytes"):
            return AudioRef(data=value["bytes"], offset=ref.offset, duration=ref.duration)
        path = value.get("path")
        if path:
            p = Path(path)
            return AudioRef(path=str(p if p.is_absolute() else Path(src) / p), offset=ref.offset,
                            duration=ref.duration)
        return AudioRef(data=b"", offset=ref.offset, duration=ref.duration)
    return AudioRef(data=bytes(value or b""), offset=ref.offset, duration=ref.duration)
