"""Packing variable-length samples into fixed-length rows, and the micro-batch format.

Packing policy (deterministic, bounded wait): the packer holds up to `buffer_size`
samples in arrival order. A micro-batch of `rows` rows is filled by placing the
OLDEST buffered sample first (so no sample waits more than `buffer_size` batches),
then the rest longest-first, each into the first row with room (first-fit
decreasing). Samples that do not fit stay buffered for the next micro-batch.
With packing off, each row holds one sample, padded.

Micro-batch (all torch tensors unless said):
  tokens, labels      int64 [B, S]   labels[i] is the target after tokens[i]; padding = pad id
  loss_mask           float32 [B, S] 1 where labels are trained (response tokens)
  position_ids        int64 [B, S]   restart at 0 for every sample (and for the tail padding)
  cu_seqlens          int32 [n+1]    THD boundaries over the flattened B*S tokens: every sample
                                     and every row's tail padding is one sequence (megatron
                                     PackedSeqParams cu_seqlens_q/kv; qkv_format="thd")
  max_seqlen          int            longest of those sequences
  dataset_index       int64 [B, S]   index into dataset_names per token, -1 on padding
  dataset_names       list[str]      names of the datasets of the mixture (index -> name)
  sample_datasets     list[str]      dataset of each sample in the micro-batch, in token order
  audio_features      float32 [C, n_mels, window_frames]  one entry per clip, in placeholder order;
                                     under data.features_on=device instead audio_waveforms float32
                                     [C, longest clip's samples] (zero-padded), audio_mel_bins and
                                     audio_window_frames (ints): mel.batch_features makes the
                                     features on the encoder's device
  audio_lengths       int64 [C]      mel frames the model reads of each clip (frames.read_frames)
  audio_num_tokens    int64 [C]      placeholders of each clip (adapter output kept per clip)
  audio_clip_rows     int64 [C]      the row each clip's placeholders are in
  audio_clip_ctc      bool [C]       whether each clip's sample is its transcript (joint CTC target)
  audio_clip_keys     int64 [C, 2]   (sample position, clip number within the sample) of each clip:
                                     what its training-time random draws are seeded from
  audio_token_id      int            the placeholder token id
  answer_starts       list[int]      per sample, in token order: where its scored answer starts
                                     (generation is prompted with the sample's tokens before it)
  num_samples, num_tokens (non-padding), packed (bool)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from orchestrator.data.prompts import Tokenized


@dataclass
class Example:
    """One tokenized sample, ready to pack."""

    position: int  # position in the global sample order (for resumption)
    dataset_id: int
    tokenized: Tokenized
    clips: List[np.ndarray] = field(default_factory=list)  # 16-kHz audio per clip
    sample_id: int = -1  # mosaic's global sample id (feature cache key)
    features: Optional[torch.Tensor] = None  # [clips, mels, frames] when already computed (cache)
    feature_lengths: Optional[torch.Tensor] = None
    truncated: bool = False  # a conversation cut at a turn boundary to fit data.seq_length

    def __len__(self) -> int:
        return len(self.tokenized)


class Packer:
    def __init__(self, seq_length: int, rows: int, buffer_size: int, packing: bool = True):
        if packing and buffer_size < rows:
            raise ValueError(f"data.packing_buffer ({buffer_size}) must be at least the micro batch size ({rows})")
        self.seq_length, self.rows, self.packing = seq_length, rows, packing
        self.buffer_size = buffer_size if packing else rows
        self.buffer: List[Example] = []

    def add(self, ex: Example) -> None:
        if len(ex) > self.seq_length:
            raise ValueError(f"sample of {len(ex)} tokens does not fit data.seq_length ({self.seq_length})")
        self.buffer.append(ex)

    def full(self) -> bool:
        return len(self.buffer) >= self.buffer_size

    def pending_positions(self) -> List[int]:
        return [ex.position for ex in self.buffer]

    def pop_rows(self) -> List[List[Example]]:
        """Rows of the next micro-batch (fewer than `rows` only when the buffer runs dry)."""
        if not self.buffer:
            return []
        if not self.packing:
            rows = [[ex] for ex in self.buffer[: self.rows]]
            self.buffer = self.buffer[self.rows:]
            return rows
        rows: List[List[Example]] = [[] for _ in range(self.rows)]
        free = [self.seq_length] * self.rows
        oldest, rest = self.buffer[0], self.buffer[1:]
        order = [oldest] + sorted(rest, key=lambda ex: (-len(ex), ex.position))
        placed = set()
        for ex in order:
            n = len(ex)
            for r in range(self.rows):
                if free[r] >= n:
                    rows[r].append(ex)
                    free[r] -= n
                    placed.add(id(ex))
                    break
        self.buffer = [ex for ex in self.buffer if id(ex) not in placed]
        return [row for row in rows if row]


def collate(rows: Sequence[Sequence[Example]], seq_length: int, pad_id: int, dataset_names: Sequence[str], audio_token_id: int, num_rows: Optional[int] = None,
            features_fn=None, packed: bool = True) -> Dict[str, Any]:
    """Rows of examples -> the micro-batch dict (see the module docstring)."""
    b = num_rows or len(rows)
    tokens = np.full((b, seq_length), pad_id, dtype=np.int64)
    labels = np.full((b, seq_length), pad_id, dtype=np.int64)
    loss_mask = np.zeros((b, seq_length), dtype=np.float32)
    positions = np.zeros((b, seq_length), dtype=np.int64)
    dataset_index = np.full((b, seq_length), -1, dtype=np.int64)
    seqlens: List[int] = []
    examples: List[Example] = []
    clip_tokens: List[int] = []
    clip_rows: List[int] = []
    clip_ctc: List[bool] = []
    clip_keys: List[List[int]] = []
    answer_starts: List[int] = []
    sample_datasets: List[str] = []
    num_tokens = 0
    for r in range(b):
        row = rows[r] if r < len(rows) else []
        at = 0
        for ex in row:
            t = ex.tokenized
            n = len(t)
            tokens[r, at:at + n], labels[r, at:at + n], loss_mask[r, at:at + n] = t.tokens, t.labels, t.loss_mask
            positions[r, at:at + n] = np.arange(n)
            dataset_index[r, at:at + n] = ex.dataset_id
            seqlens.append(n)
            examples.append(ex)
            clip_tokens.extend(t.audio_tokens)
            clip_rows.extend([r] * len(t.audio_tokens))
            clip_ctc.extend([t.ctc] * len(t.audio_tokens))
            clip_keys.extend([ex.position, j] for j in range(len(t.audio_tokens)))
            answer_starts.append(t.answer_start)
            sample_datasets.append(dataset_names[ex.dataset_id])
            num_tokens += n
            at += n
        if at < seq_length:
            positions[r, at:] = np.arange(seq_length - at)
            seqlens.append(seq_length - at)
    cu = np.zeros(len(seqlens) + 1, dtype=np.int32)
    cu[1:] = np.cumsum(seqlens)
    batch: Dict[str, Any] = {
        "tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels),
        "loss_mask": torch.from_numpy(loss_mask), "position_ids": torch.from_numpy(positions),
        "cu_seqlens": torch.from_numpy(cu), "max_seqlen": int(max(seqlens)) if seqlens else 0,
        "dataset_index": torch.from_numpy(dataset_index), "dataset_names": list(dataset_names),
        "sample_datasets": sample_datasets, "audio_token_id": int(audio_token_id),
        "audio_num_tokens": torch.tensor(clip_tokens, dtype=torch.long),
        "audio_clip_rows": torch.tensor(clip_rows, dtype=torch.long),
        "audio_clip_ctc": torch.tensor(clip_ctc, dtype=torch.bool),
        "audio_clip_keys": torch.tensor(clip_keys, dtype=torch.long).reshape(-1, 2), "answer_starts": answer_starts,
        "num_samples": len(sample_datasets), "num_tokens": num_tokens, "packed": packed,
    }
    if features_fn is not None:
        # features_fn(examples) -> the audio entries ("audio_features" [clips, mels, frames]
        # or the waveforms of data.features_on=device, "audio_lengths" [clips]), clips in
        # placeholder order.
        batch.update(features_fn(examples))
    return batch


def packed_seq_params(batch: Dict[str, Any]):
    """megatron-core PackedSeqParams (THD) for a micro-batch flattened to [1, B*S]."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = batch["cu_seqlens"]
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=batch["max_seqlen"],
                           max_seqlen_kv=batch["max_seqlen"])


def row_document_mask(position_ids: torch.Tensor, query_slots: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[B, 1, S, S] bool attention mask of packed rows, True where query and key lie in
    different documents (megatron's convention: True = masked out). Positions restart at 0
    at every document and at a row's tail padding, which is how documents are found.
    With causal attention on top, each row then attends exactly as THD attention over
    its documents would; RoPE is relative, so the per-row positions give the same scores
    as per-document ones. `query_slots` (context parallel): only those query rows,
    [B, 1, len(query_slots), S]."""
    documents = torch.cumsum(position_ids == 0, dim=1)
    queries = documents if query_slots is None else documents[:, query_slots]
    return (queries[:, :, None] != documents[:, None, :])[:, None]


def used_columns(batch: Dict[str, Any]) -> int:
    """Columns up to the last that holds a sample token in some row (at least 1); the
    columns after it are padding in every row."""
    used = (batch["dataset_index"] >= 0).any(dim=0).nonzero()
    return int(used.max()) + 1 if used.numel() else 1


def utilization(batch: Dict[str, Any]) -> float:
    """Share of the batch's token slots that hold sample tokens."""
    return batch["num_tokens"] / batch["tokens"].numel()
