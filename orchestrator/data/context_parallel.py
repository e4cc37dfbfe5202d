"""Context-parallel split of a micro-batch, with audio routed to its placeholders.

Megatron's load-balanced layout: a sequence is cut into 2*CP equal chunks and CP
rank r keeps chunks r and 2*CP-1-r (causal attention work is then equal on every
rank). Unpacked rows are split as one sequence each (Megatron's sbhd
`get_batch_on_this_cp_rank`); packed rows (THD) are split per sample and per tail
padding, each of which the packer padded to a multiple of 2*CP.

Audio: adapter outputs are consumed in placeholder order over the flattened
batch (clip 0's tokens, then clip 1's, ...). `audio_frame_index` lists, for this
rank, which of those frames its placeholders hold, in its own token order; the
model computes the audio embeddings (all clips, or only `audio_clips` below) and
gathers these rows.
"""

from __future__ import annotations

from typing import Any, Dict, List

import torch


def chunk_ranges(start: int, length: int, cp_size: int, cp_rank: int) -> List[range]:
    """Token index ranges that CP rank `cp_rank` holds of one sequence."""
    parts = 2 * cp_size
    if length % parts:
        raise ValueError(f"sequence of {length} tokens cannot be split into 2 x context_parallel_size "
                         f"({cp_size}) = {parts} equal chunks; pad it to a multiple of {parts}")
    size = length // parts
    return [range(start + c * size, start + (c + 1) * size) for c in (cp_rank, parts - 1 - cp_rank)]


def rank_token_index(batch: Dict[str, Any], cp_size: int, cp_rank: int) -> torch.Tensor:
    """[B, S / CP] indices (within each row) of the tokens this rank holds."""
    b, s = batch["tokens"].shape
    if not batch.get("packed", False):
        idx = [i for r in chunk_ranges(0, s, cp_size, cp_rank) for i in r]
        return torch.tensor(idx, dtype=torch.long).unsqueeze(0).expand(b, -1).contiguous()
    cu = batch["cu_seqlens"].tolist()
    rows: List[List[int]] = [[] for _ in range(b)]
    for start, end in zip(cu[:-1], cu[1:]):
        row, offset = divmod(start, s)
        for r in chunk_ranges(offset, end - start, cp_size, cp_rank):
            rows[row].extend(r)
    return torch.tensor(rows, dtype=torch.long)


def split_batch(batch: Dict[str, Any], cp_size: int, cp_rank: int) -> Dict[str, Any]:
    """This CP rank's share of a micro-batch (per-token tensors cut, audio routed)."""
    if cp_size == 1:
        out = dict(batch)
        out["audio_frame_index"] = torch.arange(int(batch["audio_num_tokens"].sum()))
        out["audio_clips"] = torch.arange(batch["audio_num_tokens"].numel())
        return out
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank ({cp_rank}) must be in [0, context_parallel_size ({cp_size}))")
    index = rank_token_index(batch, cp_size, cp_rank)
    out = dict(batch)
    for key in ("tokens", "labels", "loss_mask", "position_ids", "dataset_index"):
        if key in batch:
            out[key] = torch.gather(batch[key], 1, index)
    placeholder = batch["tokens"] == batch["audio_token_id"]
    # Frame number of every placeholder in the flattened batch (row-major = placeholder order).
    frame_of = torch.full(batch["tokens"].shape, -1, dtype=torch.long)
    frame_of[placeholder] = torch.arange(int(placeholder.sum()))
    total = int(batch["audio_num_tokens"].sum())
    if int(placeholder.sum()) != total:
        raise ValueError(f"batch has {int(placeholder.sum())} audio placeholders but its clips make {total} "
                         f"audio tokens")
    mine = torch.gather(frame_of, 1, index)
    frames = mine[mine >= 0]
    out["audio_frame_index"] = frames
    clip_of_frame = torch.repeat_interleave(torch.arange(batch["audio_num_tokens"].numel()),
                                            batch["audio_num_tokens"])
    out["audio_clips"] = torch.unique(clip_of_frame[frames]) if frames.numel() else frames
    out["cp_token_index"] = index
    return out
