"""Checkpoints: megatron dist_checkpointing (reshardable over TP/PP/DP), published
atomically, the last K kept.

Layout under <run_dir>/checkpoints/:
  step_000010/            one published checkpoint (dist_checkpointing format)
    rank_state/rank_00000.pt   per-rank RNG states and data-loader state
    manifest.json              size and CRC-32 of every file (orchestrator/plan/checkpoint_dirs.py)
    frozen_weights.json        with train.save_frozen_weights=false: the frozen model
                               tensors left out, and the model.init_checkpoint they are
                               read back from (FrozenWeights, dist_format.load_model_state)
  latest                  name of the newest published checkpoint (replaced atomically)
  iter_0000010 -> step_000010           Megatron-LM's names for the same checkpoints, so
  latest_checkpointed_iteration.txt     that its loaders and tools find them: a relative
                                        link per checkpoint, and the tracker file holding
                                        the step `latest` names
  .tmp-step_000020/       a save in progress (never read; removed by the next save)
  holds/step_000010/      another run's checkpoints read their frozen weights from
                          step_000010 (one file per run): kept whatever train.keep_last says
  step_000030.damaged/    a checkpoint found damaged at a resume, set aside (never read)

Every rank writes into the temporary directory; after a barrier the ranks record every
file's size and checksum in the manifest, rank 0 renames the directory to its final name
and only then points `latest` at it (write + os.replace), so a crash at any moment leaves
`latest` naming a complete checkpoint.

A resume verifies before it loads (resumable_checkpoint): the newest checkpoint whose
files all match their manifest, whatever `latest` says; one damaged since it was written
(a truncated or overwritten shard) is set aside with a warning naming the file, and the
run continues from the one before. If every checkpoint is damaged the job stops and says
so: it never starts over in silence.

Contents: model chunks ("model" or "model0", "model1", ... with virtual pipeline
stages), optimizer (distributed-optimizer state in the dp_reshardable layout), LR
scheduler, step, W&B run id, and per rank: python/numpy/torch/CUDA/megatron-tracker
RNG states and the BatchSource state.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import random
import shutil
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from orchestrator.plan.checkpoint_dirs import (FROZEN_SOURCE, HOLDS, LAYOUT, STEP_DIR, checkpoint_files, file_record,
                                               held_by, is_dist_checkpoint, layout_text, manifest_problem,
                                               read_manifest, saved_layout_of, set_aside_dirs, source_files, step_dirs,
                                               without_manifest, write_manifest)
from orchestrator.plan.model_params import model_name
from orchestrator.train.dist_format import load_model_state, use_in_process_results_queue

log = logging.getLogger(__name__)

# megatron-core 0.16.1: the default fully_sharded_model_space layout fails on load
# ("ShardedTensor.flattened_range is not supported"); dp_reshardable works.
_SHARDING_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: str | Path) -> Optional[Path]:
    """The checkpoint `latest` names, or None when the run has none."""
    root = checkpoints_dir(run_dir)
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    if not path.is_dir():
        raise FileNotFoundError(f"{pointer} names {path.name}, which does not exist: the run directory was edited by hand")
    return path


def _model_key(index: int, count: int) -> str:
    return "model" if count == 1 else f"model{index}"


def _unwrap_ddp(chunk):
    """megatron's DDP has no sharded_state_dict of its own (the generic one would
    prefix every key with `module.`): checkpoint the wrapped module."""
    from megatron.core.distributed import DistributedDataParallel

    return chunk.module if isinstance(chunk, DistributedDataParallel) else chunk


def _model_sharded_state_dict(chunks: Sequence) -> dict:
    return {_model_key(i, len(chunks)): _unwrap_ddp(c).sharded_state_dict(metadata=dict(_SHARDING_METADATA))
            for i, c in enumerate(chunks)}


def _rng_state() -> dict:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    state = {
        "python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
        "tracker": {k: v.clone() for k, v in get_cuda_rng_tracker().get_states().items()},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    get_cuda_rng_tracker().set_states(state["tracker"])


class DiskFull(RuntimeError):
    """The file system of the run directory is full (or over quota)."""


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded")


def is_disk_full(exc: BaseException, path: Path) -> bool:
    """Whether `exc` (or one it wraps: torch's checkpoint writers re-raise other ranks'
    failures, torch.save says only "file write failed") comes from a full file system
    at `path`."""
    seen, todo = set(), [exc]
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        if getattr(cur, "errno", None) in _DISK_FULL_ERRNOS or any(t in str(cur) for t in _DISK_FULL_TEXT):
            return True
        # torch's CheckpointException: {rank: (exception, traceback)} of the ranks that failed
        failures = [f[0] if isinstance(f, tuple) else f for f in getattr(cur, "failures", {}).values()]
        todo += [cur.__cause__, cur.__context__, *failures]
    try:
        return shutil.disk_usage(path).free < (1 << 20)
    except OSError:
        return False


class Retention(NamedTuple):
    """Which published checkpoints a save keeps: the newest `last` (train.keep_last), and
    every one whose step is a multiple of `every` (train.keep_every; 0: none), for
    `audiollm eval RUN --all` to score over the whole run."""

    last: int
    every: int = 0

    def pruned(self, steps_newest_first: Sequence[int]) -> list[int]:
        newest = steps_newest_first[:max(self.last, 1)]
        return [s for s in steps_newest_first if s not in newest and not (self.every and s % self.every == 0)]


class FrozenWeights(NamedTuple):
    """The frozen model tensors a run's checkpoints leave out (train.save_frozen_weights=
    false): their checkpoint keys, every rank's, and FROZEN_SOURCE's record of where they
    are."""

    keys: frozenset
    record: dict


def frozen_weights(chunks: Sequence, source: str, loaded: Sequence[str]) -> Optional[FrozenWeights]:
    """Collective. Of the model tensors `loaded` (checkpoint keys) from the checkpoint
    `source`, those that stay frozen in this run: what its checkpoints need not hold, as
    long as `source` stays as it is. None when there are none."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    frozen = set()
    for chunk, entries in zip(chunks, _model_sharded_state_dict(chunks).values()):
        trains = {model_name(name): p.requires_grad for name, p in _unwrap_ddp(chunk).named_parameters()}
        frozen.update(sharded.key for name, sharded in entries.items()
                      if not isinstance(sharded, ShardedObject) and trains.get(name) is False)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, frozen)
    keys = frozenset(set().union(*gathered) & set(loaded))
    if not keys:
        return None
    files = [source_files(Path(source)) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(files, src=0)
    return FrozenWeights(keys, {"source": str(Path(source).resolve()), "files": files[0], "tensors": sorted(keys)})


def save_checkpoint(run_dir, step: int, chunks: Sequence, optimizer, scheduler, batch_source,
                    wandb_run_id: Optional[str], keep: Retention, background: Optional["BackgroundSaves"] = None,
                    frozen: Optional[FrozenWeights] = None) -> Path:
    """Collective. Without `background` the checkpoint is written and published before
    this returns; with it, only what is needed for a consistent copy happens here (the
    save plan, the common and per-rank state, the copy of the tensors to host) and a
    forked process writes the tensors while training goes on: `background.finish`
    publishes it. A full disk removes the partial save (so the run directory's other
    files can still be written) and raises DiskFull naming the path, the step and the
    checkpoint a rerun resumes from. With `frozen`, the checkpoint leaves those tensors
    out and records where they are (FROZEN_SOURCE): every load reads them from there."""
    from megatron.core import dist_checkpointing

    root = checkpoints_dir(run_dir)
    name = _step_name(step)
    with _disk_full_explained(root, step, keep):
        if background is not None:
            background.finish(blocking=True)  # one save in flight at a time
        tmp, state = _begin(root, name, step, chunks, optimizer, scheduler, wandb_run_id, frozen)
        # In the background megatron returns the request whose function writes the tensor
        # files; the save plan (agreed by every rank) and the common state are done here.
        request = dist_checkpointing.save(state, str(tmp), async_sharded_save=background is not None)
        _write_rank_files(tmp, optimizer, batch_source)
        if background is None:
            _publish(root, name, keep, written={})
        else:
            background.schedule(request, root, step, keep)
    return root / name


def _step_name(step: int) -> str:
    return f"step_{step:06d}"


@contextmanager
def _disk_full_explained(root: Path, step: int, keep: Retention):
    name = _step_name(step)
    try:
        yield
    except BaseException as exc:  # torch's CheckpointException is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit, DiskFull)) or not is_disk_full(exc, root):
            raise
        shutil.rmtree(root / f".tmp-{name}", ignore_errors=True)
        shutil.rmtree(root / f".tmp-{name}.written", ignore_errors=True)
        pointer = root / "latest"
        latest = pointer.read_text().strip() if pointer.is_file() else None
        raise DiskFull(f"disk full at {root} while saving step {step}; latest is "
                       + (f"{latest}, which a rerun of the same command resumes from" if latest else
                          "none (no checkpoint was completed)")
                       + f". The partial save was removed; free space there (or lower train.keep_last, now "
                         f"{keep.last}, or raise train.keep_every, now {keep.every}) and run the same command "
                         f"again") from exc


def _begin(root: Path, name: str, step: int, chunks: Sequence, optimizer, scheduler,
           wandb_run_id: Optional[str], frozen: Optional[FrozenWeights]) -> tuple:
    """Collective: the temporary directory (empty, but for FROZEN_SOURCE with `frozen`) and
    the sharded state to write into it."""
    use_in_process_results_queue()
    final, tmp = root / name, root / f".tmp-{name}"
    if dist.get_rank() == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):  # a save that crashed earlier
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # the same step saved by a run that crashed before publishing
            shutil.rmtree(final)
        tmp.mkdir()
        if frozen is not None:
            (tmp / FROZEN_SOURCE).write_text(json.dumps(frozen.record, indent=1) + "\n")
    dist.barrier()
    model_sd = _model_sharded_state_dict(chunks)
    state = dict(model_sd)
    if frozen is not None:
        state.update({part: {name: sharded for name, sharded in entries.items()
                             if getattr(sharded, "key", None) not in frozen.keys}
                      for part, entries in model_sd.items()})
    # The optimizer's state is mapped onto the whole model's (its parameters all train).
    state["optimizer"] = optimizer.sharded_state_dict(model_sd, metadata=dict(_SHARDING_METADATA))
    state["scheduler"] = scheduler.state_dict()
    state["step"] = step
    state["wandb_run_id"] = wandb_run_id
    state["iteration"] = step  # what Megatron-LM's checkpointing.py reads for the step
    state["checkpoint_version"] = MEGATRON_CHECKPOINT_VERSION
    return tmp, state


def _write_rank_files(tmp: Path, optimizer, batch_source) -> None:
    """Collective: this rank's RNG and data state, and (rank 0) the layout the planning
    side reads to show (or refuse) a change of size."""
    rank = dist.get_rank()
    rank_dir = tmp / "rank_state"
    if rank == 0:
        rank_dir.mkdir(exist_ok=True)
    dist.barrier()
    data, layout = batch_source.state_dict(), parallel_layout()
    torch.save({"rng": _rng_state(), "data": data, "world_size": dist.get_world_size(), "layout": layout},
               rank_dir / f"rank_{rank:05d}.pt")
    if rank == 0:
        distributed = getattr(optimizer.config, "use_distributed_optimizer", False)
        (tmp / LAYOUT).write_text(json.dumps({**layout, "world_size": dist.get_world_size(),
                                              "canonical_nodes": data.get("canonical_nodes"),
                                              "optimizer": _SHARDING_METADATA["distrib_optim_sharding_type"]
                                              if distributed else None}) + "\n")


def _publish(root: Path, name: str, keep: Retention, written: dict) -> None:
    """Collective, once every file is written: the manifest (`written`: records of this
    rank's files checksummed already), then rank 0 renames the directory and points
    `latest` at it."""
    tmp = root / f".tmp-{name}"
    dist.barrier()
    _write_manifest(tmp, written)
    if dist.get_rank() == 0:
        os.replace(tmp, root / name)
        _point_latest(root, name)
        shutil.rmtree(root / f".tmp-{name}.written", ignore_errors=True)
        _prune(root, keep)
    dist.barrier()


# Megatron-LM's tracker file and checkpoint names (its training/checkpointing.py), and the
# checkpoint_version its loader expects of checkpoints it did not write.
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
MEGATRON_CHECKPOINT_VERSION = 3.0


def _megatron_name(name: str) -> str:
    return f"iter_{int(name.split('_')[1]):07d}"


def _replace_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _point_latest(root: Path, name: str) -> None:
    """Rank 0: `latest` names checkpoint `name`, and Megatron-LM's names follow: its
    iter_ link first, then `latest`, then the tracker, each replaced atomically, so that
    at any moment both pointers name a complete checkpoint that their names reach."""
    link = root / _megatron_name(name)
    if not (link.is_symlink() and os.readlink(link) == name):
        tmp = link.with_name(link.name + ".tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(name)  # relative: the run directory may move
        os.replace(tmp, link)
    _replace_text(root / "latest", name + "\n")
    _replace_text(root / MEGATRON_TRACKER, str(int(name.split("_")[1])))


def _drop_dangling_megatron_names(root: Path) -> None:
    for link in root.glob("iter_*"):
        if link.is_symlink() and not link.exists():
            link.unlink()


class BackgroundSaves:
    """Checkpoints written while training goes on (train.async_save). The save plan, the
    copy of the tensors to host and the small per-rank files happen at the save; a forked
    process (megatron's TemporalAsyncCaller: the fork is the copy on a CPU machine, a D2H
    copy precedes it on a GPU one) writes the tensor files and checksums them; `finish`,
    called by every rank after every step, publishes a save once every rank's writer is
    done. Until then `latest` names the previous checkpoint, so a crash at any moment
    still leaves it naming a complete one."""

    def __init__(self):
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        self.calls = AsyncCallsQueue(persistent=False)
        self.published: list = []  # (name, seconds from the save to its publication), for the loop to report
        self._saving: tuple = ()  # (root, step, retention) of the save in flight

    def pending(self) -> bool:
        return self.calls.get_num_unfinalized_calls() > 0

    def schedule(self, request, root: Path, step: int, keep: Retention) -> None:
        name = _step_name(step)
        results_dir = root / f".tmp-{name}.written"  # each rank's writer leaves its results here
        self._saving = (root, step, keep)
        rank = dist.get_rank()
        if rank == 0:
            results_dir.mkdir()
        dist.barrier()
        written: dict = {}
        started = time.perf_counter()

        def collect():  # before megatron's finalization, which reads the writer's results
            if request.async_fn is None:  # nothing of the sharded state on this rank
                return
            path = results_dir / f"rank_{rank:05d}.pkl"
            try:
                results, records = pickle.loads(path.read_bytes())
            except (OSError, pickle.UnpicklingError, EOFError) as exc:
                results, records = RuntimeError(f"rank {rank}'s checkpoint writer left no results ({exc})"), {}
            request.async_fn_args[2].put(results)
            written.update(records)

        def publish():
            _publish(root, name, keep, written)
            self.published.append((name, time.perf_counter() - started))

        if request.async_fn is not None:
            request = request._replace(async_fn=partial(_write_in_background, request.async_fn, results_dir))
        self.calls.schedule_async_request(request._replace(finalize_fns=[collect, *request.finalize_fns, publish]))

    def finish(self, blocking: bool = False) -> None:
        """Collective: publish the saves whose files every rank has written (all of them,
        waiting, with `blocking`)."""
        if self.pending():
            with _disk_full_explained(*self._saving):
                self.calls.maybe_finalize_async_calls(blocking=blocking)


def _write_in_background(write, results_dir: Path, rank: int, buckets, results_queue) -> None:
    """In the forked writer: megatron's write, then its results and the size and CRC-32 of
    each file written (for the manifest), left in a file for the training process."""
    write(rank, buckets, results_queue)
    results = results_queue.get_nowait()  # this process's copy of the in-process queue
    records = {} if isinstance(results, BaseException) else {key: file_record(Path(path))
                                                              for path, key, _ in buckets}
    try:
        payload = pickle.dumps((results, records))
    except Exception as exc:  # noqa: BLE001 - an exception that does not pickle still fails the save
        payload = pickle.dumps((RuntimeError(f"checkpoint writer of rank {rank} failed: {exc!r}"), {}))
    tmp = results_dir / f"rank_{rank:05d}.pkl.tmp"
    with open(tmp, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, results_dir / f"rank_{rank:05d}.pkl")


def _prune(root: Path, keep: Retention) -> None:
    """Delete the checkpoints `keep` does not keep, but those another run holds (its
    checkpoints read their frozen weights there: checkpoint_dirs.hold_checkpoint); with a
    deleted checkpoint, the holds of deleted runs on it (held_by)."""
    steps = {int(STEP_DIR.match(p.name).group(1)): p for p in step_dirs(root.parent)}
    for step in keep.pruned(list(steps)):
        name = steps[step].name
        holders = held_by(root, name)
        if not holders:
            shutil.rmtree(steps[step], ignore_errors=True)
            shutil.rmtree(root / HOLDS / name, ignore_errors=True)
        elif name not in _SAID_HELD:
            _SAID_HELD.add(name)
            log.info("checkpoint %s is kept beyond train.keep_last: the checkpoints of %s read their frozen weights "
                     "from it (it goes at the next save after %s or those runs' directories are deleted)",
                     name, ", ".join(holders), root / HOLDS / name)
    _drop_dangling_megatron_names(root)


_SAID_HELD: set = set()  # held checkpoints this process has said it keeps


def _my_share(names: Sequence[str]) -> list:
    """This rank's share of a checkpoint's files, to read for their checksums."""
    rank, world = dist.get_rank(), dist.get_world_size()
    return [name for i, name in enumerate(names) if i % world == rank]


def _write_manifest(tmp: Path, written: dict) -> None:
    """Collective: every rank checksums its share of the saved files not in `written` (the
    records of the files this rank's background writer checksummed); rank 0 writes the
    manifest (before the directory is published)."""
    known = [None] * dist.get_world_size()
    dist.all_gather_object(known, written)
    files = {k: v for part in known for k, v in part.items()}
    names = [checkpoint_files(tmp) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(names, src=0)
    mine = {name: file_record(tmp / name) for name in _my_share([n for n in names[0] if n not in files])}
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() == 0:
        files.update({k: v for part in gathered for k, v in part.items()})
        write_manifest(tmp, files)


class NoCompleteCheckpoint(RuntimeError):
    """The run has checkpoints, and none of them is complete."""


def _problem(path: Path) -> Optional[str]:
    """Collective: what is wrong with checkpoint `path`, the same answer on every rank."""
    # Rank 0 reads the manifest for all: every rank must take the same branch below.
    read = [(read_manifest(path), is_dist_checkpoint(path)) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(read, src=0)
    (files, why), dist_format = read[0]
    if files is None:
        return without_manifest(why, dist_format)
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, manifest_problem(path, files, _my_share(sorted(files))))
    return next((p for p in problems if p), None)


def resumable_checkpoint(run_dir) -> Optional[Path]:
    """Collective: the newest complete checkpoint of the run, or None when it has none.
    Damaged ones newer than it are renamed step_N.damaged (rank 0 warns, naming the file
    and what is wrong) and `latest` is pointed at it; raises NoCompleteCheckpoint when
    every checkpoint is damaged, now or at an earlier resume."""
    rank = dist.get_rank()
    candidates = step_dirs(run_dir)
    damaged = []
    for path in candidates:
        problem = _problem(path)
        if problem is None:
            break
        damaged.append((path, problem))
    else:
        path = None
    dist.barrier()  # every rank has read them before rank 0 moves anything
    if rank == 0:
        for bad, problem in damaged:
            aside = bad.with_name(bad.name + ".damaged")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(bad, aside)
            log.warning("checkpoint %s is damaged: %s; set aside as %s", bad, problem, aside.name)
        if damaged and path is not None:
            log.warning("resuming from %s, the newest complete checkpoint", path.name)
            _point_latest(checkpoints_dir(run_dir), path.name)
        if damaged:
            _drop_dangling_megatron_names(checkpoints_dir(run_dir))
    dist.barrier()
    earlier = [p.name for p in reversed(set_aside_dirs(run_dir))  # newest first, as `damaged`
               if p.name not in {f"{bad.name}.damaged" for bad, _ in damaged}]
    if path is None and (damaged or earlier):  # every run of the same command says it again
        found = [f"{bad.name}: {problem}" for bad, problem in damaged] + [f"{name} (set aside earlier)" for name in earlier]
        raise NoCompleteCheckpoint(
            f"no complete checkpoint in {checkpoints_dir(run_dir)}: " + "; ".join(found)
            + f". Damaged checkpoints are kept as step_N.damaged. Not starting over in silence: to train from the "
              f"start, move {checkpoints_dir(run_dir)} away and run the same command again, or pass "
              f"run.name=<new name>")
    return path


def _restore_adam_steps(optimizer) -> None:
    """megatron-core 0.16.1's dp_reshardable load copies the loading template's
    per-parameter Adam 'step' (the priming step's 1) over the loaded one, so a resumed
    run's bias correction restarted and its losses drifted from the second step after the
    resume. Each parameter group's 'step' is loaded right: set every parameter's from it
    (a tensor of its own each: the load left one shared by all)."""
    for chained in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = chained.optimizer
        for group in inner.param_groups:
            if group.get("step") is None:
                continue
            for param in group["params"]:
                state = inner.state.get(param)
                if state and "step" in state:
                    state["step"] = torch.tensor(float(group["step"]), dtype=state["step"].dtype,
                                                 device=state["step"].device)


def _prime_distributed_optimizer(chunks: Sequence, optimizer) -> None:
    """megatron's DistributedOptimizer builds its loading state dict only once Adam
    has state ('step'); take one step with zero gradients (everything it changes is
    overwritten by the load)."""
    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    optimizer.step()


def load_checkpoint(path: Path, chunks: Sequence, optimizer, scheduler, batch_source) -> dict:
    """Restore everything save_checkpoint wrote, also into a job at another parallel
    layout (weights and optimizer state resharded by dist_checkpointing, the data state
    merged from every rank's). Returns {'step', 'wandb_run_id'}."""
    rank_dir = path / "rank_state"
    own = rank_dir / f"rank_{dist.get_rank():05d}.pt"
    state = torch.load(own, weights_only=False) if own.exists() else None
    saved_layout = (state or torch.load(rank_dir / "rank_00000.pt", weights_only=False)).get("layout")
    layout = parallel_layout()
    # Files written before the layout was recorded: the world size stands for it.
    same_layout = state is not None and state["world_size"] == dist.get_world_size() and \
        (saved_layout or layout) == layout
    distributed = getattr(optimizer.config, "use_distributed_optimizer", False)
    # The distributed optimizer's layout (dp_reshardable for every checkpoint this project
    # writes: megatron-core 0.16.1's fully_reshardable layout, which reshards over TP and PP
    # too, does not load into torch's AdamW, whose per-parameter 'step' it has no source for).
    saved_format = (saved_layout_of(path) or {}).get("optimizer") if distributed else None
    problem = optimizer_reshard_problem(saved_format, saved_layout, layout)
    if problem:
        raise ValueError(f"{path}: {problem}")
    if distributed:
        _prime_distributed_optimizer(chunks, optimizer)
    model_sd = _model_sharded_state_dict(chunks)
    request = dict(model_sd)
    request["optimizer"] = optimizer.sharded_state_dict(model_sd, is_loading=True, metadata=dict(_SHARDING_METADATA))
    loaded = load_model_state(request, path)
    for i, chunk in enumerate(chunks):
        _unwrap_ddp(chunk).load_state_dict(loaded[_model_key(i, len(chunks))])
    # fp32 distributed optimizer: main params are views of requires-grad model params.
    with torch.no_grad():
        optimizer.load_state_dict(loaded["optimizer"])
    if distributed:
        _restore_adam_steps(optimizer)
    scheduler.load_state_dict(loaded["scheduler"])
    if same_layout:
        _set_rng_state(state["rng"])
        data = state["data"]
    else:
        data = _merged_data_state(path, batch_source)
        if dist.get_rank() == 0:
            log.warning("continuing at another size: the checkpoint was written at %s, this job is %s; every rank "
                        "reads on from its canonical nodes' positions, and RNG states start fresh",
                        layout_text(saved_layout), layout_text(layout))
    batch_source.load_state_dict(data)
    return {"step": int(loaded["step"]), "wandb_run_id": loaded.get("wandb_run_id")}


def optimizer_reshard_problem(saved_format: Optional[str], saved: Optional[dict], now: dict) -> Optional[str]:
    """Why a checkpoint's optimizer state cannot load at the layout `now`, or None."""
    if saved_format != "dp_reshardable" or not saved or all(saved[k] == now[k] for k in ("tp", "pp", "cp")):
        return None
    return (f"its distributed-optimizer state was saved at {layout_text(saved)} in megatron's dp_reshardable layout, "
            f"which loads at another data-parallel size only, and this job is {layout_text(now)}. Continue it at "
            f"TP {saved['tp']} PP {saved['pp']} CP {saved['cp']} with any data-parallel size that divides the run's "
            f"canonical nodes; runs without parallel.distributed_optimizer also continue at another TP, PP or CP")


def parallel_layout() -> dict:
    """This job's parallel sizes, kept with each rank's state: a rank's RNG and data state
    are its own again only under the same layout."""
    from megatron.core import parallel_state as ps

    return {"tp": ps.get_tensor_model_parallel_world_size(), "pp": ps.get_pipeline_model_parallel_world_size(),
            "cp": ps.get_context_parallel_world_size(), "dp": ps.get_data_parallel_world_size()}


def _merged_data_state(path: Path, batch_source) -> dict:
    """Every rank's data state of the checkpoint at `path` as one (`merge_states` of the
    batch source; read once, by rank 0, and broadcast): each rank of a job at another
    layout takes its own share from it."""
    merged = [None]
    if dist.get_rank() == 0:
        files = sorted((path / "rank_state").glob("rank_*.pt"))
        merged[0] = batch_source.merge_states([torch.load(f, weights_only=False)["data"] for f in files])
    dist.broadcast_object_list(merged, src=0)
    return merged[0]


def load_model_weights(path: Path, chunks: Sequence, strict: bool = True) -> None:
    """Model weights only (evaluation, init_checkpoint, another parallel layout):
    dist_checkpointing reshards to this job's TP/PP."""
    model_sd = _model_sharded_state_dict(chunks)
    loaded = load_model_state(model_sd, path)
    for i, chunk in enumerate(chunks):
        _unwrap_ddp(chunk).load_state_dict(loaded[_model_key(i, len(chunks))], strict=strict)
