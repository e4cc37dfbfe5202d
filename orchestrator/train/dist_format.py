"""Model weights as megatron `dist_checkpointing` global tensors: the format of the
project's training checkpoints, so one conversion loads at any TP / PP / virtual-PP
layout (dist_checkpointing reshards on load) and a training checkpoint exports without
its cluster.

Checkpoint keys are the AudioLLM's state-dict names, except that megatron stacks the
decoder layers along a leading layer axis: `language_model.decoder.layers.{i}.<rest>`
is row i of the global tensor `language_model.decoder.layers.<rest>` [num_layers, ...].
fc1 ([gate; up]) and LoRA factors are global tensors in the TP=1 layout. The embedding
is stored unpadded; megatron pads it to each layout's vocabulary multiple on load
(`allow_shape_mismatch`).

`write_model_tensors` writes (name, tensor) pairs one layer at a time as they come;
`read_model_tensors` reads the model tensors of any such checkpoint (a converted one
or a training step) back as full TP=1 tensors, under their state-dict names, and
`read_stored_tensors` some of them (one decoder layer's rows, for a streamed export).
"""

from __future__ import annotations

import queue
import re
import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterable, Optional, Tuple

import torch

LAYERS = "language_model.decoder.layers."
# Top-level modules of the AudioLLM: checkpoint keys outside them (optimizer state,
# scheduler, step) are not model weights.
MODEL_PREFIXES = ("language_model.", "encoder.", "adapter.")
_LAYER_NAME = re.compile(r"^language_model\.decoder\.layers\.(\d+)\.(.+)$")


def checkpoint_key(name: str) -> Tuple[str, Optional[int]]:
    """(checkpoint key, layer index or None) of an AudioLLM state-dict name."""
    match = _LAYER_NAME.match(name)
    if match:
        return LAYERS + match.group(2), int(match.group(1))
    return name, None


def use_in_process_results_queue() -> None:
    """dist_checkpointing's writer hands its results back through a queue served by a
    spawned multiprocessing.Manager process (megatron-core 0.16.1,
    strategies/filesystem_async._get_write_results_queue). Our saves are synchronous:
    the put and the get both happen in this process, so an in-process queue does the
    same job without that extra process -- which a crashed rank would leave behind,
    orphaned and holding the job's stdout, and which forces a __main__ guard on every
    entry script. Without the module attribute (another megatron version) this does
    nothing and megatron's own queue is used."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", "missing") is None:
        filesystem_async._results_queue = queue.Queue()


@contextmanager
def process_group():
    """dist_checkpointing needs torch.distributed: inside a job, its group; in a
    command-line conversion, a one-process gloo group for the duration."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    from orchestrator.runtime import cpu_compat

    cpu_compat.activate()  # dist_checkpointing synchronizes CUDA; a no-op with CUDA present
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def write_model_tensors(out_dir: Path, tensors: Iterable[Tuple[str, torch.Tensor]], num_layers: int) -> int:
    """Save (state-dict name, full tensor) pairs as a dist_checkpointing checkpoint in
    `out_dir` (under the "model" key, as training checkpoints hold them). Returns the
    number of checkpoint tensors (decoder layers stacked)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    state: Dict[str, ShardedTensor] = {}
    keys = set()
    for name, tensor in tensors:
        key, layer = checkpoint_key(name)
        if layer is None:
            state[name] = ShardedTensor.from_rank_offsets(key, tensor, replica_id=0)
        else:
            state[name] = ShardedTensor.from_rank_offsets(key, tensor, (0, layer, num_layers), replica_id=0,
                                                          prepend_axis_num=1)
        keys.add(key)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    use_in_process_results_queue()
    with process_group():
        dist_checkpointing.save({"model": state}, str(out_dir))
    return len(keys)


def stored_model_tensors(ckpt_dir: Path) -> dict:
    """{checkpoint key: ShardedTensor without data (global shape and dtype)} of the model
    tensors a dist_checkpointing directory holds, those it leaves in the checkpoint it
    froze them from (FROZEN_SOURCE) included."""
    from megatron.core import dist_checkpointing

    record = _checked_frozen_source(ckpt_dir)
    with process_group():
        stored = dist_checkpointing.load_tensors_metadata(str(ckpt_dir))
    own = {k: v for k, v in stored.items() if k.startswith(MODEL_PREFIXES)}
    if record is None:
        return own
    frozen = stored_model_tensors(Path(record["source"]))
    return {**{k: frozen[k] for k in record["tensors"]}, **own}


def load_model_state(request: dict, ckpt_dir: Path, whole: bool = True) -> dict:
    """dist_checkpointing.load of `request` from `ckpt_dir`, where the model tensors the
    checkpoint leaves in the one it froze them from (FROZEN_SOURCE) are read from there
    (and so on down the chain). `whole` False: the request may cover part of a tensor
    (one layer's row), which dist_checkpointing's access check would refuse."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.dict_utils import extract_matching_values, merge, nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    record = _checked_frozen_source(ckpt_dir)
    if record is None:
        return dist_checkpointing.load(request, str(ckpt_dir), validate_access_integrity=whole)
    left_out = set(record["tensors"])
    elsewhere, here = extract_matching_values(
        request, lambda v: not isinstance(v, ShardedObject) and getattr(v, "key", None) in left_out)
    loaded = dist_checkpointing.load(here, str(ckpt_dir), validate_access_integrity=whole)
    if any(True for _ in nested_values(elsewhere)):
        # Only the tensors asked of the source: a load also returns its checkpoint's common
        # state, which for a training run's checkpoint (its optimizer's step, its scheduler)
        # differs from this one's, and merge refuses two values for one entry.
        merge(loaded, _requested(elsewhere, load_model_state(elsewhere, Path(record["source"]), whole)))
    return loaded


def _requested(request, loaded):
    """The entries of `loaded` at the places `request` has entries (dicts and lists alike)."""
    if isinstance(request, dict):
        return {k: _requested(v, loaded[k]) for k, v in request.items() if k in loaded}
    if isinstance(request, list):
        return [_requested(v, item) for v, item in zip(request, loaded)]
    return loaded


def _checked_frozen_source(ckpt_dir: Path) -> Optional[dict]:
    """FROZEN_SOURCE of a checkpoint, or None; FrozenSourceError when the weights it names
    cannot be read back as they were."""
    from orchestrator.plan.checkpoint_dirs import frozen_source, frozen_source_problem

    record = frozen_source(ckpt_dir)
    if record is not None:
        problem = frozen_source_problem(ckpt_dir)
        if problem:
            raise FrozenSourceError(problem)
    return record


class FrozenSourceError(FileNotFoundError):
    """A checkpoint's frozen weights, left in another checkpoint, are gone or changed."""


def read_stored_tensors(ckpt_dir: Path, stored: dict, keys: Iterable[str],
                        layer: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """Full (TP=1) tensors of checkpoint `keys` (`stored`: stored_model_tensors' metadata),
    in their stored dtype; with `layer`, only row `layer` of stacked decoder-layer keys,
    named `language_model.decoder.layers.{layer}.<rest>` -- dist_checkpointing reads just
    that slice, so an export holds one layer at a time. Call inside process_group()."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    keys, request = list(keys), {}
    for key in keys:
        meta = stored[key]
        if layer is None:
            request[key] = ShardedTensor.from_rank_offsets(key, torch.empty(meta.global_shape, dtype=meta.dtype),
                                                           replica_id=0)
        else:
            # Row `layer` as a [1, ...] block of the stacked tensor (prepend_axis_num would
            # take dist_checkpointing's older path, which wants every row on some rank).
            request[key] = ShardedTensor.from_rank_offsets(
                key, torch.empty((1, *meta.global_shape[1:]), dtype=meta.dtype), (0, layer, meta.global_shape[0]),
                replica_id=0)
    # The load also returns the checkpoint's common state: only the keys asked are taken.
    loaded = load_model_state(request, ckpt_dir, whole=layer is None)
    if layer is None:
        return {key: loaded[key] for key in keys}
    return {f"{LAYERS}{layer}.{key[len(LAYERS):]}": loaded[key][0] for key in keys}


def read_model_tensors(ckpt_dir: Path) -> Dict[str, torch.Tensor]:
    """Every model tensor of a dist_checkpointing directory as a full (TP=1) tensor,
    keyed by AudioLLM state-dict name (decoder layers unstacked), in its stored dtype.
    The embedding keeps the rows it was stored with (padded in a training checkpoint)."""
    with process_group():  # one group for both reads
        stored = stored_model_tensors(ckpt_dir)
        loaded = read_stored_tensors(ckpt_dir, stored, stored)
    out: Dict[str, torch.Tensor] = {}
    for key, tensor in loaded.items():
        if key.startswith(LAYERS):
            rest = key[len(LAYERS):]
            for i in range(tensor.shape[0]):
                out[f"{LAYERS}{i}.{rest}"] = tensor[i].clone()  # own storage: safetensors refuses shared
        else:
            out[key] = tensor
    return out
