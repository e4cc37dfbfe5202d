"""MDS datasets of a data config -> one mosaic `StreamingDataset` with one `Stream` each.

One StreamingDataset with many Streams (mosaic's own proportional mixing) keeps the
open files and shared memory constant however many datasets are listed; one
StreamingDataset per dataset runs out of file descriptors after a few dozen.

Every process opens its own single-rank view of the mixture (mosaic's world is
set to rank 0 of 1 while the dataset is built): the sample order is then a pure
function of (datasets, weights, seed, epoch), identical on every rank, and the
loader deals samples to data-parallel ranks by position (sample g goes to rank
g % dp_size). Tensor/context/pipeline-parallel peers of a data-parallel rank thus
see the same samples without any knowledge of Megatron's rank layout. Local
datasets are read in place; remote ones are cached under a directory unique to
the process, so concurrent runs and tests never share mosaic's cache or its
shared-memory registrations.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

REMOTE_SCHEMES = ("s3://", "gs://", "oci://", "azure://", "azure-dl://", "hf://", "dbfs:", "sftp://", "http://",
                  "https://")
_GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class ResolvedDataset:
    name: str  # unique; a glob entry's matches are named <entry name>/<directory name>
    path: str  # local directory or remote URI
    weight: float  # share of the mixture (an entry's weight split over its matches by size)
    num_samples: Optional[int] = None  # known for local datasets (from index.json)


def is_remote(path: str) -> bool:
    return path.startswith(REMOTE_SCHEMES)


def _local_num_samples(path: str) -> int:
    index = Path(path) / "index.json"
    try:
        shards = json.loads(index.read_text())["shards"]
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is not an MDS dataset: {index} does not exist") from None
    except (ValueError, KeyError) as err:
        raise ValueError(f"MDS index {index} is not readable ({err}); rewrite the dataset") from err
    return int(sum(s["samples"] for s in shards))


def resolve_entries(entries: Sequence[Any]) -> List[ResolvedDataset]:
    """Config entries {name, path, weight} -> datasets, globs expanded (local paths only)."""
    out: List[ResolvedDataset] = []
    for entry in entries:
        name, path, weight = str(entry.name), str(entry.path), float(getattr(entry, "weight", 1.0))
        if not any(c in path for c in _GLOB_CHARS):
            size = None if is_remote(path) else _local_num_samples(path)
            out.append(ResolvedDataset(name, path, weight, size))
            continue
        if is_remote(path):
            raise ValueError(f"dataset {name}: glob patterns are expanded for local paths only, got {path}; "
                             f"list remote datasets one by one")
        matches = sorted(p for p in glob.glob(path) if (Path(p) / "index.json").is_file())
        if not matches:
            raise FileNotFoundError(f"dataset {name}: no MDS dataset (directory with index.json) matches {path}")
        sizes = [_local_num_samples(p) for p in matches]
        total = sum(sizes) or 1
        prefix = os.path.commonpath(matches) if len(matches) > 1 else os.path.dirname(matches[0])
        for match, size in zip(matches, sizes):
            suffix = os.path.relpath(match, prefix)
            # The entry's weight is shared by its matches in proportion to their size, as if
            # they were one dataset.
            out.append(ResolvedDataset(f"{name}/{suffix}", match, weight * size / total, size))
    names = [d.name for d in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"dataset names must be unique after glob expansion; repeated: {', '.join(dupes)}")
    return out


class _NoDistributed:
    """Stands in for torch.distributed inside mosaic while a single-rank view is built."""

    def __getattr__(self, name):
        import torch.distributed

        return getattr(torch.distributed, name)

    @staticmethod
    def is_available() -> bool:
        return False

    @staticmethod
    def is_initialized() -> bool:
        return False


# Mosaic modules that call torch.distributed barriers while a dataset is built.
_MOSAIC_DIST_USERS = ("streaming.base.shared.prefix", "streaming.base.dataset", "streaming.base.util",
                      "streaming.base.distributed")


@contextlib.contextmanager
def single_rank_world():
    """Build mosaic datasets as rank 0 of a world of 1.

    Mosaic reads its world from RANK/WORLD_SIZE/LOCAL_* and, when torch.distributed is
    initialized, puts barriers into dataset construction. Each process here builds its
    own single-rank view, possibly at other moments than its peers (validation sets),
    so both are hidden from mosaic while the dataset is built and restored after.
    """
    import importlib

    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    saved = {k: os.environ.get(k) for k in keys}
    modules = [importlib.import_module(m) for m in _MOSAIC_DIST_USERS]
    saved_dist = [m.dist for m in modules]
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    for m in modules:
        m.dist = _NoDistributed()
    try:
        yield
    finally:
        for m, d in zip(modules, saved_dist):
            m.dist = d
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def process_cache_root(cache_dir: Optional[str]) -> str:
    """A cache directory for remote shards that no other process uses."""
    base = cache_dir or os.path.join(tempfile.gettempdir(), "audiollm-mds-cache")
    return os.path.join(base, f"pid{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _dataset_class():
    from streaming import StreamingDataset

    class LocatedStreamingDataset(StreamingDataset):
        """Samples carry their global id; a failed read returns a marker instead of raising,
        so one bad shard does not end the iteration (the loader decides: error or skip)."""

        def get_item(self, sample_id: int, retry: int = 7) -> Any:
            try:
                sample = super().get_item(sample_id, retry=1)
            except Exception as err:  # a corrupt shard can raise almost anything while parsing
                return {"__sample_id__": int(sample_id), "__read_error__": f"{type(err).__name__}: {err}"}
            sample["__sample_id__"] = int(sample_id)
            return sample

    return LocatedStreamingDataset


def open_mixture(datasets: Sequence[ResolvedDataset], seed: int, shuffle: bool, cache_root: str,
                 proportional: bool = True):
    """One StreamingDataset over all datasets; weights become stream proportions."""
    from streaming import Stream

    def make_streams():
        streams = []
        for i, d in enumerate(datasets):
            remote = d.path if is_remote(d.path) else None
            local = os.path.join(cache_root, f"{i:05d}") if remote else os.path.abspath(d.path)
            kwargs = {"proportion": d.weight} if proportional and len(datasets) > 1 else {}
            streams.append(Stream(remote=remote, local=local, **kwargs))
        return streams

    cls = _dataset_class()
    last_err: Optional[Exception] = None
    for attempt in range(20):
        # Fresh Stream objects each attempt: a failed StreamingDataset init has already
        # turned their proportions into repeat/choose, which the next init refuses.
        streams = make_streams()
        try:
            with single_rank_world():
                return cls(streams=streams, shuffle=shuffle, shuffle_seed=seed, num_canonical_nodes=1,
                           batch_size=1, replication=None, allow_unsafe_types=False)
        except FileExistsError as err:
            # Two processes registered the same free shared-memory prefix at once; the next
            # attempt finds the following one.
            last_err = err
            time.sleep(0.05 * (attempt + 1))
    raise RuntimeError(f"could not register mosaic shared memory after 20 attempts: {last_err}")


def locate(dataset, sample_id: int, datasets: Sequence[ResolvedDataset]) -> Dict[str, Any]:
    """Global sample id -> dataset name, shard file and index within the dataset."""
    shard_id, in_shard = dataset.spanner[sample_id]
    stream_id = int(dataset.stream_per_shard[shard_id])
    shard = dataset.shards[shard_id]
    first_shard = int(dataset.shard_offset_per_stream[stream_id])
    in_dataset = int(sum(s.samples for s in dataset.shards[first_shard:shard_id])) + int(in_shard)
    return {
        "dataset": datasets[stream_id].name,
        "stream_id": stream_id,
        "shard": os.path.join(datasets[stream_id].path, shard.raw_data.basename),
        "index": in_dataset,
    }


def stream_names(datasets: Sequence[ResolvedDataset]) -> List[str]:
    return [d.name for d in datasets]


def iterate(dataset) -> Iterator[Dict[str, Any]]:
    return iter(dataset)
