"""MDS datasets of a data config -> one mosaic `StreamingDataset` with one `Stream` each,
and the sample ids each data-parallel rank reads.

One StreamingDataset with many Streams (mosaic's own proportional mixing) keeps the
open files and shared memory constant however many datasets are listed; one
StreamingDataset per dataset runs out of file descriptors after a few dozen.

Every process opens its own single-rank view of the mixture (mosaic's world is
set to rank 0 of 1 while the dataset is built) and reads samples by id. Which ids,
in which order, is mosaic's own partition of the epoch (`RankOrder`): the training
mixture has one canonical node per data-parallel rank, so rank r walks canonical
node r's contiguous, shard-aware shuffled span of the epoch and touches about
1/dp_size of the shards. The order is a pure function of (datasets, weights, seed,
epoch, dp_size, dp_rank); tensor/context/pipeline-parallel peers of a data-parallel
rank compute the same order and each read the same samples, without any knowledge
of Megatron's rank layout. Local datasets are read in place; remote ones are cached
under a directory unique to the process, so concurrent runs and tests never share
mosaic's cache or its shared-memory registrations.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from orchestrator.plan.local_paths import GLOB_CHARS, is_remote


@dataclass(frozen=True)
class ResolvedDataset:
    name: str  # unique; a glob entry's matches are named <entry name>/<directory name>
    path: str  # local directory or remote URI
    weight: float  # share of the mixture (an entry's weight split over its matches by size)
    num_samples: Optional[int] = None  # known for local datasets (from index.json)
    # The config entry it came from: its task, template and columns (orchestrator.plan.tasks).
    entry: Any = field(default=None, compare=False)


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
        if not any(c in path for c in GLOB_CHARS):
            size = None if is_remote(path) else _local_num_samples(path)
            out.append(ResolvedDataset(name, path, weight, size, entry))
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
            out.append(ResolvedDataset(f"{name}/{suffix}", match, weight * size / total, size, entry))
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


class ShardFetchError(RuntimeError):
    """A remote shard that could not be fetched after mosaic's retries: the run stops
    (whatever data.on_bad_sample says), naming the dataset, the shard and the cause."""


def _dataset_class():
    from streaming import StreamingDataset

    class LocatedStreamingDataset(StreamingDataset):
        """Samples carry their global id; a sample that cannot be parsed returns a marker
        instead of raising, so one bad shard does not end the stream (the loader decides:
        error or skip). A shard that cannot be fetched raises ShardFetchError."""

        dataset_names: Sequence[str] = ()  # per stream, for messages

        def prepare_shard(self, shard_id: int, blocking: bool = True) -> None:
            try:
                super().prepare_shard(shard_id, blocking)
            except Exception as err:
                from streaming.base.dataset import _ShardState

                from orchestrator.data.remote import describe_download_error

                # Mosaic marks the shard PREPARING before downloading and LOCAL only on
                # success: left so, every later read of it (in any worker: the state is in
                # shared memory) would wait forever.
                with self._cache_filelock:
                    if self._shard_states[shard_id] == _ShardState.PREPARING:
                        self._shard_states[shard_id] = _ShardState.REMOTE
                stream_id = int(self.stream_per_shard[shard_id])
                stream = self.streams[stream_id]
                uri = os.path.join(stream.remote or stream.local, self.shards[shard_id].raw_data.basename)
                name = self.dataset_names[stream_id] if self.dataset_names else f"stream {stream_id}"
                raise ShardFetchError(describe_download_error(name, uri, err)) from err

        def get_item(self, sample_id: int, retry: int = 7) -> Any:
            try:
                sample = super().get_item(sample_id, retry=1)
            except ShardFetchError:
                raise
            except Exception as err:  # a corrupt shard can raise almost anything while parsing
                return {"__sample_id__": int(sample_id), "__read_error__": f"{type(err).__name__}: {err}"}
            sample["__sample_id__"] = int(sample_id)
            return sample

    return LocatedStreamingDataset


def open_mixture(datasets: Sequence[ResolvedDataset], seed: int, shuffle: bool, cache_root: str,
                 proportional: bool = True, canonical_nodes: int = 1, cache_limit: Optional[str] = None,
                 download_retry: int = 2):
    """One StreamingDataset over all datasets; weights become stream proportions.

    canonical_nodes: mosaic's unit of partition (one per data-parallel rank for training);
    cache_limit: most bytes of remote shards kept under cache_root (mosaic evicts the
    least recently used shard beyond it; None: no limit); download_retry: re-attempts of
    a failed shard download (mosaic's own argument of that name counts attempts)."""
    from streaming import Stream

    def make_streams():
        streams = []
        for i, d in enumerate(datasets):
            remote = d.path if is_remote(d.path) else None
            local = os.path.join(cache_root, f"{i:05d}") if remote else os.path.abspath(d.path)
            kwargs = {"proportion": d.weight} if proportional and len(datasets) > 1 else {}
            streams.append(Stream(remote=remote, local=local, download_retry=download_retry + 1, **kwargs))
        return streams

    cls = _dataset_class()
    last_err: Optional[Exception] = None
    for attempt in range(20):
        # Fresh Stream objects each attempt: a failed StreamingDataset init has already
        # turned their proportions into repeat/choose, which the next init refuses.
        streams = make_streams()
        made: list = []
        try:
            with single_rank_world(), _prefix_probes_released() as made:
                # shuffle_block_size: mosaic's own default, set here because mosaic only fills it
                # in when iterated, and the order is computed without iterating.
                dataset = cls(streams=streams, shuffle=shuffle, shuffle_seed=seed,
                              num_canonical_nodes=canonical_nodes,
                              shuffle_block_size=max(4_000_000 // canonical_nodes, 1 << 18), batch_size=1,
                              replication=None, allow_unsafe_types=False, cache_limit=cache_limit)
            kept = {id(block) for block in _mixture_blocks(dataset)}
            _release([block for block in made if id(block) not in kept])
            dataset.dataset_names = [d.name for d in datasets]
            return dataset
        except FileExistsError as err:
            # Two processes registered the same free shared-memory prefix at once; the next
            # attempt finds the following one.
            last_err = err
            _release(made)
            time.sleep(0.05 * (attempt + 1))
    raise RuntimeError(f"could not register mosaic shared memory after 20 attempts: {last_err}")


def _release(blocks) -> None:
    """Close mosaic SharedMemory wrappers now instead of at process exit (mosaic registers
    each one's cleanup with atexit, which also keeps it open until then)."""
    import atexit

    for block in blocks:
        atexit.unregister(block.cleanup)
        block.cleanup()


def _mixture_blocks(dataset) -> list:
    """The shared-memory blocks a mixture holds: on the dataset or inside mosaic's
    SharedScalar / SharedArray / SharedBarrier wrappers, at most three attributes deep."""
    from streaming.base.shared.memory import SharedMemory

    blocks, seen = [], set()

    def collect(obj, depth: int) -> None:
        if id(obj) in seen or depth > 3:
            return
        seen.add(id(obj))
        if isinstance(obj, SharedMemory):
            blocks.append(obj)
        elif (type(obj).__module__.startswith("streaming.") or obj is dataset) and hasattr(obj, "__dict__"):
            for value in list(vars(obj).values()):
                collect(value, depth + 1)

    collect(dataset, 0)
    return blocks


@contextlib.contextmanager
def _prefix_probes_released():
    """While a StreamingDataset is built, mosaic's search for a free shared-memory prefix
    attaches to the blocks of every dataset alive in the process and never closes them:
    6 file descriptors for each live mixture, each time another one is opened. Records
    the wrappers that search makes; those the new dataset does not keep are closed."""
    from streaming.base.shared import prefix

    made, original = [], prefix.SharedMemory

    class Recorded(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    prefix.SharedMemory = Recorded
    try:
        yield made
    finally:
        prefix.SharedMemory = original


def close_mixture(dataset) -> None:
    """Give back the shared memory of a mixture from `open_mixture`; it is not usable
    afterwards. Mosaic keeps it until the process exits otherwise: about 14 file
    descriptors (and /dev/shm entries) per mixture. A training job opens two and never
    notices; a process that opens mixtures again and again (tests, notebooks, an
    evaluation service) runs out of file descriptors without this."""
    _release(_mixture_blocks(dataset))


class RankOrder:
    """The sample ids data-parallel rank `dp_rank` of `dp_size` reads, epoch after epoch.

    Mosaic's own partition (`streaming.base.batching.generate_work`) of each epoch over a
    world of dp_size nodes with one rank and one worker each, the mixture having
    dp_size canonical nodes: rank r gets canonical node r's span, resampled by stream
    proportion and shuffled with the mixture's seed. Mosaic pads the epoch with a few
    repeated samples so that every rank gets the same count (`per_epoch`). Position k of
    the rank's stream is sample `per_epoch`-th of epoch k // per_epoch.
    """

    def __init__(self, mixture, dp_rank: int, dp_size: int):
        if int(mixture.num_canonical_nodes) != dp_size:
            raise ValueError(f"the mixture has {mixture.num_canonical_nodes} canonical nodes; the order of "
                             f"{dp_size} data-parallel ranks needs one per rank (open_mixture canonical_nodes)")
        self.mixture, self.dp_rank, self.dp_size = mixture, dp_rank, dp_size
        self._epoch = -1
        self._ids = None
        self.per_epoch = len(self.epoch_ids(0))

    def epoch_ids(self, epoch: int):
        if epoch != self._epoch:
            from streaming.base.batching import generate_work
            from streaming.base.world import World

            world = World(num_nodes=self.dp_size, ranks_per_node=1, workers_per_rank=1, worker=self.dp_rank)
            work = generate_work(self.mixture.batching_method, self.mixture, world, epoch, 0)
            ids = work[self.dp_rank].reshape(-1)
            self._ids, self._epoch = ids[ids >= 0], epoch
        return self._ids

    def sample_id(self, position: int) -> int:
        epoch, offset = divmod(position, self.per_epoch)
        return int(self.epoch_ids(epoch)[offset])


class SampleLocator:
    """Sample id -> dataset, shard and index within the dataset, from mosaic's own offset
    tables (`sample_offset_per_stream`, `spanner`): the cost per sample does not grow
    with the number of shards or datasets."""

    def __init__(self, mixture, datasets: Sequence[ResolvedDataset]):
        self.datasets = list(datasets)
        self.mixture = mixture

    def streams(self, sample_ids):
        """The stream (dataset index) of each sample id."""
        import numpy as np

        ids = np.asarray(sample_ids, dtype=np.int64)
        return np.searchsorted(self.mixture.sample_offset_per_stream, ids, side="right") - 1

    def __call__(self, sample_id: int) -> Dict[str, Any]:
        shard_id, _ = self.mixture.spanner[int(sample_id)]
        stream_id = int(self.mixture.stream_per_shard[shard_id])
        return {
            "dataset": self.datasets[stream_id].name,
            "stream_id": stream_id,
            "shard": os.path.join(self.datasets[stream_id].path, self.mixture.shards[shard_id].raw_data.basename),
            "index": int(sample_id) - int(self.mixture.sample_offset_per_stream[stream_id]),
        }


def stream_names(datasets: Sequence[ResolvedDataset]) -> List[str]:
    return [d.name for d in datasets]

