"""Scatter audio embeddings into the token embeddings at placeholder positions."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from orchestrator.models.speech import to_device


def check_audio_placeholders(input_ids: torch.Tensor, audio_token_id: int, tokens_per_clip: Sequence[int],
                             clip_rows: Optional[Sequence[int]] = None) -> None:
    """Every row of `input_ids` [b, s] must hold exactly as many `audio_token_id`
    placeholders as its clips have audio tokens (`clip_rows[i]`: the batch row of clip i,
    default clip i in row i; a packed row may hold several clips, in order). Reads the
    ids: call it on the host copy of a batch (the provider does, before the batch goes to
    the GPU), never on device tensors inside the forward, where it would stall the host."""
    clip_rows = list(range(len(tokens_per_clip))) if clip_rows is None else list(clip_rows)
    if len(clip_rows) != len(tokens_per_clip):
        raise ValueError(f"{len(tokens_per_clip)} audio clips but {len(clip_rows)} clip row indices")
    if any(b < a for a, b in zip(clip_rows, clip_rows[1:])):
        raise ValueError(f"audio clips must be ordered by batch row; got clip rows {clip_rows}")
    placeholders = (input_ids == audio_token_id).sum(dim=1).tolist()
    expected = [0] * input_ids.shape[0]
    for row, count in zip(clip_rows, tokens_per_clip):
        if not 0 <= row < len(expected):
            raise ValueError(f"audio clip row {row} is outside the batch of {len(expected)} rows")
        expected[row] += int(count)
    bad = [
        f"sample {row}: {have} placeholder tokens (id {audio_token_id}) but its audio "
        f"({', '.join(f'clip {i}: {tokens_per_clip[i]}' for i, r in enumerate(clip_rows) if r == row) or 'no clip'}) "
        f"gives {want} audio tokens"
        for row, (have, want) in enumerate(zip(placeholders, expected)) if have != want
    ]
    if bad:
        raise ValueError("audio placeholders do not match the audio lengths: " + "; ".join(bad)
                         + ". The data side must insert audio_token_count(mel_frames, frame_stack) "
                         "placeholders per clip")


def fuse_audio(embeddings: torch.Tensor, input_ids: torch.Tensor, audio_embeddings: torch.Tensor,
               audio_token_id: int) -> torch.Tensor:
    """Replace each `audio_token_id` position of `input_ids` [b, s] by the next row of
    `audio_embeddings` [n, h] (clips flattened in order; row-major over the batch). No
    host sync: the counts are checked on the host beforehand (check_audio_placeholders)."""
    mask = input_ids == audio_token_id
    source = audio_embeddings.to(device=embeddings.device, dtype=embeddings.dtype)
    return embeddings.masked_scatter(mask.unsqueeze(-1).to(embeddings.device), source)


def check_routed_frames(input_ids: torch.Tensor, audio_token_id: int, frame_index: torch.Tensor) -> None:
    """Context parallel, on the host copy: this rank's placeholders and routed frames agree."""
    placeholders = int((input_ids == audio_token_id).sum())
    if placeholders != frame_index.numel():
        raise ValueError(f"{placeholders} audio placeholders on this context-parallel rank but "
                         f"{frame_index.numel()} audio frames routed to it")


def fuse_audio_frames(embeddings: torch.Tensor, input_ids: torch.Tensor, audio_embeddings: torch.Tensor,
                      audio_token_id: int, frame_index: torch.Tensor) -> torch.Tensor:
    """Context parallel: replace the `audio_token_id` positions of this rank's `input_ids`
    [b, s/cp] (row-major) by the rows `frame_index` of `audio_embeddings` (the adapter
    output of the clips this rank encodes; orchestrator.data.context_parallel)."""
    mask = input_ids == audio_token_id
    source = audio_embeddings.index_select(0, to_device(frame_index, audio_embeddings.device))
    source = source.to(device=embeddings.device, dtype=embeddings.dtype)
    return embeddings.masked_scatter(mask.unsqueeze(-1).to(embeddings.device), source)
