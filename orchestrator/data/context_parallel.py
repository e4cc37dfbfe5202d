"""Context-parallel split of a micro-batch, with audio routed to its placeholders.

Megatron's load-balanced layout: each row of S tokens is cut into 2*CP equal chunks
and CP rank r keeps chunks r and 2*CP-1-r (causal attention work is then about equal on
every rank). Packed rows are split the same way, as whole rows: their documents are an
attention mask over global slots (orchestrator.models.attention), so a document may
span chunks and ranks, and no sample needs padding to a multiple of 2*CP. This is the
layout megatron's rotary embedding assumes for [s, b] inputs under CP, and the one
`rank_slots` and `gathered_order` describe to the attention.

Audio: adapter outputs are consumed in placeholder order over the flattened batch
(clip 0's tokens, then clip 1's, ...). `split_batch` lists, for this rank, which of
those frames its placeholders hold, in its own token order (`audio_frames`), and the
clips they come from (`audio_clips`); the provider encodes those clips only and
scatters the listed frames. A clip whose placeholders straddle a chunk boundary is
encoded on each rank that holds some of them (the encoder sees the whole clip).
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch

# Per-token [B, S] fields of a loader micro-batch that a CP rank keeps its share of.
PER_TOKEN_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "dataset_index")


def chunk_ranges(start: int, length: int, cp_size: int, cp_rank: int) -> List[range]:
    """Token index ranges that CP rank `cp_rank` holds of one sequence."""
    parts = 2 * cp_size
    if length % parts:
        raise ValueError(f"sequence of {length} tokens cannot be split into 2 x context_parallel_size "
                         f"({cp_size}) = {parts} equal chunks; pad it to a multiple of {parts}")
    size = length // parts
    return [range(start + c * size, start + (c + 1) * size) for c in (cp_rank, parts - 1 - cp_rank)]


def rank_slots(local_length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """[local_length] global slots (within the row) of CP rank `cp_rank`'s tokens, in its order."""
    first, second = chunk_ranges(0, local_length * cp_size, cp_size, cp_rank)
    return torch.cat([torch.arange(first.start, first.stop), torch.arange(second.start, second.stop)])


def gathered_order(local_length: int, cp_size: int) -> torch.Tensor:
    """Permutation that puts the rank-by-rank concatenation of every CP rank's tokens
    (what an all-gather over the CP group gives) into global slot order."""
    slots = torch.cat([rank_slots(local_length, cp_size, r) for r in range(cp_size)])
    return torch.argsort(slots)


def split_batch(batch: Dict[str, Any], cp_size: int, cp_rank: int) -> Dict[str, Any]:
    """This CP rank's share of a micro-batch: per-token tensors cut to [B, S / CP] in the
    rank's slot order, `audio_frames` (global numbers of the adapter frames its
    placeholders hold, in its row-major token order) and `audio_clips` (the clips those
    come from, ascending). The unsplit batch stays as `cp_unsplit` and the slots as
    `cp_slots`."""
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank ({cp_rank}) must be in [0, context_parallel_size ({cp_size}))")
    tokens = batch["tokens"]
    b, s = tokens.shape
    chunk_ranges(0, s, cp_size, cp_rank)  # raises, naming the sizes, unless S splits into 2*CP chunks
    slots = rank_slots(s // cp_size, cp_size, cp_rank)
    out = dict(batch)
    for key in PER_TOKEN_KEYS:
        if key in batch:
            out[key] = batch[key][:, slots]
    placeholder = tokens == batch["audio_token_id"]
    total = int(batch["audio_num_tokens"].sum())
    if int(placeholder.sum()) != total:
        raise ValueError(f"batch has {int(placeholder.sum())} audio placeholders but its clips make {total} "
                         f"audio tokens")
    # Frame number of every placeholder in the flattened batch (row-major = placeholder order).
    frame_of = torch.full(tokens.shape, -1, dtype=torch.long)
    frame_of[placeholder] = torch.arange(total)
    mine = frame_of[:, slots]
    frames = mine[mine >= 0]
    clip_of_frame = torch.repeat_interleave(torch.arange(batch["audio_num_tokens"].numel()),
                                            batch["audio_num_tokens"])
    out["audio_frames"] = frames
    out["audio_clips"] = torch.unique(clip_of_frame[frames])
    out["cp_slots"] = slots
    out["cp_unsplit"] = batch
    return out


def frame_index_within(clips: torch.Tensor, frames: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
    """`frames` (global frame numbers) as rows of the adapter output of `clips` alone
    (ascending clip numbers, each clip's frames in order)."""
    starts = torch.cumsum(num_tokens, 0) - num_tokens  # global first frame of each clip
    clip_of_frame = torch.repeat_interleave(torch.arange(num_tokens.numel()), num_tokens)
    sub_counts = num_tokens[clips]
    sub_starts = torch.cumsum(sub_counts, 0) - sub_counts
    position = torch.full((num_tokens.numel(),), -1, dtype=torch.long)
    position[clips] = torch.arange(clips.numel())
    owner = clip_of_frame[frames]
    if bool((position[owner] < 0).any()):
        raise ValueError("frames of clips that are not encoded on this rank")
    return sub_starts[position[owner]] + frames - starts[owner]
