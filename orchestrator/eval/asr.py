"""Transcribe validation batches with greedy decoding and score them.

A validation micro-batch (orchestrator.data.packing format, packed or not) holds
samples = prompt + reference answer. The prompt of a sample is its tokens up to and
including the first position whose label is trained (loss_mask), i.e. everything
before the answer; its clips are the next ones in placeholder order. The reference
transcripts come with the batch (`transcripts`, one per sample in token order).
"""

from __future__ import annotations

import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import torch

from orchestrator.eval.wer import word_errors
from orchestrator.models.generate import greedy_generate


def prompts_from_batch(batch: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Each sample of the batch: {"prompt": [ids], "clips": [clip indices]} in token order."""
    tokens = batch["tokens"].reshape(-1)
    mask = batch["loss_mask"].reshape(-1)
    owner = batch["dataset_index"].reshape(-1)
    cu = batch["cu_seqlens"].tolist()
    audio_id = int(batch["audio_token_id"])
    clip_tokens = [int(n) for n in batch["audio_num_tokens"].tolist()]
    samples: List[Dict[str, Any]] = []
    next_clip = 0
    for start, end in zip(cu[:-1], cu[1:]):
        if int(owner[start]) < 0:
            continue  # a row's tail padding
        trained = torch.nonzero(mask[start:end] > 0).flatten()
        if trained.numel() == 0:
            raise ValueError(f"sample at flat tokens {start}..{end} has no trained label: no answer to score")
        prompt = tokens[start:start + int(trained[0]) + 1].tolist()
        placeholders = sum(1 for t in prompt if t == audio_id)
        clips = []
        while placeholders > 0:
            if next_clip >= len(clip_tokens):
                raise ValueError("prompt placeholders outnumber the batch's audio clips")
            placeholders -= clip_tokens[next_clip]
            clips.append(next_clip)
            next_clip += 1
        if placeholders != 0:
            raise ValueError("a prompt's audio placeholders do not match whole clips (audio_num_tokens)")
        samples.append({"prompt": prompt, "clips": clips})
    return samples


def transcribe_batch(model, batch: Mapping[str, Any], tokenizer, stop_ids: Sequence[int],
                     max_new_tokens: int = 48) -> List[str]:
    """Greedy transcripts of every sample of a validation batch, in token order."""
    samples = prompts_from_batch(batch)
    clip_rows = [i for i, s in enumerate(samples) for _ in s["clips"]]
    order = [c for s in samples for c in s["clips"]]
    features = lengths = None
    if order:
        features = batch["audio_features"][order]
        lengths = [int(batch["audio_lengths"][c]) for c in order]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = greedy_generate(model, [s["prompt"] for s in samples], features, lengths, stop_ids,
                          max_new_tokens=max_new_tokens, pad_id=pad, audio_clip_rows=clip_rows)
    return [tokenizer.decode(x, skip_special_tokens=True) for x in ids]


def default_stop_ids(tokenizer, response_suffix: str = "<end_of_turn>") -> List[int]:
    """The response suffix's first token (end of turn) and eos: where an answer ends."""
    ids = []
    suffix = tokenizer(response_suffix, add_special_tokens=False)["input_ids"] if response_suffix else []
    if suffix:
        ids.append(int(suffix[0]))
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("no stop token: the tokenizer has no eos and data.response_suffix is empty")
    return ids


def evaluate_wer(model, validation: Mapping[str, Iterable[Mapping[str, Any]]], tokenizer,
                 stop_ids: Optional[Sequence[int]] = None, max_new_tokens: int = 48,
                 max_batches: Optional[int] = None, examples: int = 0) -> Dict[str, Dict[str, Any]]:
    """WER per validation dataset plus "all" (pooled). Each entry: wer, errors, words,
    substitutions, deletions, insertions, utterances, seconds; with `examples` > 0 also
    the first few (reference, hypothesis) pairs."""
    stop_ids = list(stop_ids) if stop_ids is not None else default_stop_ids(tokenizer)
    report: Dict[str, Dict[str, Any]] = {}
    pooled = {"errors": 0, "words": 0, "substitutions": 0, "deletions": 0, "insertions": 0, "utterances": 0}
    for name, loader in validation.items():
        started = time.perf_counter()
        refs: List[str] = []
        hyps: List[str] = []
        for k, batch in enumerate(loader):
            if max_batches is not None and k >= max_batches:
                break
            hyps += transcribe_batch(model, batch, tokenizer, stop_ids, max_new_tokens)
            refs += list(batch["transcripts"])
        counts = word_errors(refs, hyps)
        for key in pooled:
            pooled[key] += counts[key]
        entry: Dict[str, Any] = {**counts, "wer": counts["errors"] / max(counts["words"], 1),
                                 "seconds": time.perf_counter() - started}
        if examples:
            entry["examples"] = list(zip(refs[:examples], hyps[:examples]))
        report[name] = entry
    report["all"] = {**pooled, "wer": pooled["errors"] / max(pooled["words"], 1)}
    return report
