"""Which of a run's input paths this machine can see, checked before anything is queued.

A job reads data.tokenizer (a local HF tokenizer directory: it never downloads) and every
local dataset of data.train and data.validation (an MDS directory with its index.json)
at start. Where the job runs on this machine (launcher=local) a path missing here fails
it there, so planning refuses it; a SLURM job reads them on its compute nodes, which may
see paths this machine does not, so there it is said, not refused. Remote datasets
(s3://, gs://, ...) are read by the job (orchestrator/data/remote.py); paths inside
data.demo_corpus are written by `audiollm train` before it submits.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Iterator, Optional

# URL schemes a dataset path may have (mosaic streaming's remotes); the job side's
# data/sources.py reads them from here.
REMOTE_SCHEMES = ("s3://", "gs://", "oci://", "azure://", "azure-dl://", "hf://", "dbfs:", "sftp://", "http://",
                  "https://")
GLOB_CHARS = set("*?[")


def is_remote(path: str) -> bool:
    return path.startswith(REMOTE_SCHEMES)


def absolute(path: Optional[str]) -> Optional[str]:
    """A local path made absolute (against this process's directory); remote URIs and
    None as they are."""
    return path if not path or is_remote(path) else os.path.abspath(os.path.expanduser(path))


def absolute_data_paths(data) -> None:
    """The data section's local inputs by absolute path, in place: a run's plan is read
    from other directories than the one it was started in (its job on another node, `audiollm
    eval`, `transcribe`, `convert megatron-to-hf`)."""
    data.tokenizer = absolute(data.tokenizer)
    data.demo_corpus = absolute(data.demo_corpus)
    data.cache_dir = absolute(data.cache_dir)
    for entry in [*data.train, *data.validation]:
        entry.path = absolute(entry.path)


def _shown(path: str) -> str:
    """The path as the reader can find it: relative ones with the directory they are taken from."""
    return path if os.path.isabs(path) else f"{path} (relative to {os.getcwd()})"


def inside(path: str, root: Optional[str]) -> bool:
    """Whether `path` is `root` or below it (the demo corpus: written by `audiollm train` first)."""
    if not root:
        return False
    root_abs, path_abs = os.path.abspath(root), os.path.abspath(path)
    return path_abs == root_abs or path_abs.startswith(root_abs.rstrip(os.sep) + os.sep)


def local_dataset_dirs(path: str, demo_corpus: Optional[str]) -> list[str]:
    """The MDS directories (with index.json) a local dataset path names on this machine,
    globs expanded; [] for a remote one, one inside the demo corpus (written later) or one
    not here."""
    if is_remote(path) or inside(path, demo_corpus):
        return []
    found = glob.glob(path) if any(c in path for c in GLOB_CHARS) else [path]
    return sorted(p for p in found if (Path(p) / "index.json").is_file())


def index_columns(dataset_dir: str) -> Optional[list[str]]:
    """The columns of an MDS dataset's first shard as its index.json lists them (what the
    loader checks at start, orchestrator.data.loader.check_columns); None where unreadable."""
    try:
        shards = json.loads((Path(dataset_dir) / "index.json").read_text()).get("shards") or []
        return list(shards[0]["column_names"]) if shards else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def missing_inputs(tokenizer: Optional[str], datasets: list[tuple[str, str]],
                   demo_corpus: Optional[str]) -> Iterator[tuple[str, str]]:
    """(config key, what is missing) for each input this machine does not see: the
    tokenizer directory, each local dataset (`datasets`: (key, path), globs expanded)."""
    if tokenizer and not inside(tokenizer, demo_corpus) and not Path(tokenizer).is_dir():
        yield "data.tokenizer", f"data.tokenizer={tokenizer}: no such directory {_shown(tokenizer)}"
    for key, path in datasets:
        if is_remote(path) or inside(path, demo_corpus):
            continue
        if any(c in path for c in GLOB_CHARS):
            if not any((Path(p) / "index.json").is_file() for p in glob.glob(path)):
                yield key, f"{key}: no MDS dataset (directory with index.json) matches {_shown(path)}"
        elif not (Path(path) / "index.json").is_file():
            what = "is a directory without index.json" if Path(path).is_dir() else "does not exist"
            yield key, f"{key}: {_shown(path)} {what}; an MDS dataset is a directory with index.json"
