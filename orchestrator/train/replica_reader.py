"""One data reader per model replica (data.replica_reader): within the ranks that share a
data-parallel rank (its tensor-, pipeline- and context-parallel peers, which train on the
same micro-batches) only the lowest global rank reads, decodes and computes features;
it sends each micro-batch to the others, which build no loader at all.

Why: every peer used to read, decode, resample and compute log-mel for the very same
samples itself, so at TP 4 the host did the data work of 30-s clips four times per
replica. Megatron-LM's own answer is the same (one rank per TP group reads and
broadcasts).

How: a gloo group per replica (host memory to host memory: no device copies, no
NCCL communicator of its own, and the peers' tensors stay on the host exactly as if
they had read them, so the step's host-side work is unchanged); each micro-batch is
sent whole (`broadcast_object_list`: tensors, lists and strings alike) and every peer
takes what it needs of it -- a CP rank splits its share as before, a pipeline stage
uses the keys its chunk reads. Sending the whole micro-batch to every stage costs
bandwidth the later stages do not use (the audio features), a few MB per micro-batch
over the host network against the seconds of CPU a decode of 30-s clips takes.

The data state: `state_dict` is collective (every rank of the replica calls it at the
same point of a save), and every rank's checkpoint file holds the reader's state, as
when each read for itself; a peer ignores the state it is given on resume. So a run can
switch data.replica_reader between attempts, and continuing at another size merges the
states as before.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch.distributed as dist


class ReaderFailed(RuntimeError):
    """The reader of this replica failed while reading: its peers stop with it."""


class _Failure:
    def __init__(self, text: str):
        self.text = text


class ReplicaBatches:
    """BatchSource of one model replica: `source` (the wrapped BatchSource) on its reader,
    None on its peers; every rank of the replica calls each method at the same point."""

    def __init__(self, source, group, reader: int):
        self.source, self.group, self.reader = source, group, reader
        self.dataset_names = self._share(lambda: list(source.dataset_names))

    def _share(self, read):
        """Collective in the replica: the reader's `read()`, on every rank of it. A reader
        that fails tells its peers first, so they fail with it instead of waiting."""
        box: List[object] = [None]
        failure = None
        if self.source is not None:
            try:
                box[0] = read()
            except Exception as exc:  # noqa: BLE001 - sent to the peers, then raised here
                failure, box[0] = exc, _Failure(f"{type(exc).__name__}: {exc}")
        dist.broadcast_object_list(box, src=self.reader, group=self.group)
        if failure is not None:
            raise failure
        if isinstance(box[0], _Failure):
            raise ReaderFailed(f"rank {self.reader}, which reads this replica's data, failed: {box[0].text}")
        return box[0]

    def next_microbatch(self) -> dict:
        return self._share(self.source.next_microbatch if self.source is not None else None)

    def state_dict(self) -> dict:
        return self._share(self.source.state_dict if self.source is not None else None)

    def load_state_dict(self, state: dict) -> None:
        if self.source is not None:
            self.source.load_state_dict(state)

    def merge_states(self, states: list) -> dict:
        if self.source is None:
            raise RuntimeError(f"only rank {self.reader} (this replica's reader) merges data states")
        return self.source.merge_states(states)

    def sample_counts(self) -> dict:
        return self.source.sample_counts() if self.source is not None else {}


def replica_group() -> Optional[Tuple[object, int, bool]]:
    """(gloo group, reader's global rank, whether this rank is the reader) of this rank's
    model replica: the ranks with its data-parallel rank. None when every replica is one
    process. Collective: every rank creates every replica's group, in the same order."""
    from megatron.core import parallel_state as ps

    world = dist.get_world_size()
    if ps.get_data_parallel_world_size() == world:
        return None
    dp_ranks: List[Optional[int]] = [None] * world
    dist.all_gather_object(dp_ranks, ps.get_data_parallel_rank())
    mine = None
    for dp_rank in sorted(set(dp_ranks)):
        members = [r for r in range(world) if dp_ranks[r] == dp_rank]
        group = dist.new_group(members, backend="gloo")
        if dp_rank == ps.get_data_parallel_rank():
            mine = (group, members[0], members[0] == dist.get_rank())
    return mine
