"""Answer validation batches with greedy decoding and score them.

A validation micro-batch (orchestrator.data.packing format, packed or not) holds
samples = prompt + reference answer. The prompt of a sample is its tokens before the
scored answer: `answer_starts` (one index per sample, within the sample) when the batch
carries it, else up to and including the first position whose label is trained
(loss_mask) -- right for one answer per sample, not for conversations, whose scored
answer is the last assistant turn. Its clips are those whose placeholders lie in the
prompt, in placeholder order. The references come with the batch (`transcripts`, one
per sample in token order: the scored answer's text). Each validation dataset is scored
by its loader's `metric` (orchestrator.scoring.metrics; "wer" when it has none).
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

from orchestrator.data.mel import batch_features
from orchestrator.scoring import metrics
from orchestrator.models.generate import greedy_generate

# The report's pooled entries, one per metric in use. "all" is the pooled WER, the key
# it had when WER was the only metric.
POOLED = {"wer": "all", "exact": "all/exact", "bleu": "all/bleu"}


def _whole_clips(placeholders: int, clip_tokens: Sequence[int], first: int) -> List[int]:
    """The clips from `first` on whose placeholders add up to `placeholders`."""
    clips = []
    while placeholders > 0:
        if first + len(clips) >= len(clip_tokens):
            raise ValueError("audio placeholders outnumber the batch's audio clips")
        placeholders -= clip_tokens[first + len(clips)]
        clips.append(first + len(clips))
    if placeholders != 0:
        raise ValueError("audio placeholders do not match whole clips (audio_num_tokens)")
    return clips


def prompts_from_batch(batch: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """Each sample of the batch: {"prompt": [ids], "clips": [clip indices]} in token order."""
    tokens = batch["tokens"].reshape(-1)
    mask = batch["loss_mask"].reshape(-1)
    owner = batch["dataset_index"].reshape(-1)
    cu = batch["cu_seqlens"].tolist()
    audio_id = int(batch["audio_token_id"])
    clip_tokens = [int(n) for n in batch["audio_num_tokens"].tolist()]
    answer_starts = batch.get("answer_starts")
    samples: List[Dict[str, Any]] = []
    next_clip = 0
    for start, end in zip(cu[:-1], cu[1:]):
        if int(owner[start]) < 0:
            continue  # a row's tail padding
        if answer_starts is not None:
            if len(samples) >= len(answer_starts):
                raise ValueError(f"the batch has more samples than answer_starts ({len(answer_starts)})")
            cut = int(answer_starts[len(samples)])
            if not 0 < cut <= end - start:
                raise ValueError(f"answer_start {cut} of the sample at flat tokens {start}..{end} leaves no prompt "
                                 f"or lies outside the sample")
        else:
            trained = torch.nonzero(mask[start:end] > 0).flatten()
            if trained.numel() == 0:
                raise ValueError(f"sample at flat tokens {start}..{end} has no trained label: no answer to score")
            cut = int(trained[0]) + 1
        prompt = tokens[start:start + cut].tolist()
        # Every clip of the sample is consumed, so that the next sample's clips line up
        # even where placeholders follow the answer start; generation gets those before it.
        sample_clips = _whole_clips(int((tokens[start:end] == audio_id).sum()), clip_tokens, next_clip)
        next_clip += len(sample_clips)
        in_prompt = int((tokens[start:start + cut] == audio_id).sum())
        clips = _whole_clips(in_prompt, clip_tokens, sample_clips[0]) if in_prompt else []
        samples.append({"prompt": prompt, "clips": clips})
    if answer_starts is not None and len(answer_starts) != len(samples):
        raise ValueError(f"{len(answer_starts)} answer_starts for {len(samples)} samples")
    return samples


def answer_batch(model, batch: Mapping[str, Any], tokenizer, stop_ids: Sequence[int],
                 max_new_tokens: int = 48, share: Tuple[int, int] = (0, 1), ctc_weight: float = 0.0) -> List[str]:
    """Greedy answers of the samples of a validation batch, in token order: every
    `share[1]`-th sample from sample `share[0]` on (all of them by default). `ctc_weight`
    > 0: joint CTC/attention decoding of the samples whose answer is their clips'
    transcript (the batch's audio_clip_ctc)."""
    samples = prompts_from_batch(batch)[share[0]::share[1]]
    if not samples:
        return []
    clip_rows = [i for i, s in enumerate(samples) for _ in s["clips"]]
    order = [c for s in samples for c in s["clips"]]
    features = lengths = None
    if order:
        features = batch_features(batch, next(model.parameters()).device, torch.tensor(order))
        lengths = [int(batch["audio_lengths"][c]) for c in order]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ctc_rows = None
    if ctc_weight > 0:
        transcribed = batch["audio_clip_ctc"].tolist() if "audio_clip_ctc" in batch else [False] * len(order)
        ctc_rows = [bool(s["clips"]) and all(transcribed[c] for c in s["clips"]) for s in samples]
    ids = greedy_generate(model, [s["prompt"] for s in samples], features, lengths, stop_ids,
                          max_new_tokens=max_new_tokens, pad_id=pad, audio_clip_rows=clip_rows,
                          ctc_weight=ctc_weight if ctc_rows and any(ctc_rows) else 0.0, ctc_rows=ctc_rows)
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


def answered_audio_seconds(batch: Mapping[str, Any], share: Tuple[int, int] = (0, 1)) -> float:
    """Seconds of audio in the samples of the batch that `share` answers: the mel frames
    the model reads of their clips (audio_lengths, 100 per second). Under
    data.audio_tokens=window those are whole windows, as the model encodes them."""
    lengths = batch["audio_lengths"].tolist()
    samples = prompts_from_batch(batch)[share[0]::share[1]]
    return sum(lengths[c] for s in samples for c in s["clips"]) / 100.0


def evaluate_generation(model, validation: Mapping[str, Iterable[Mapping[str, Any]]], tokenizer,
                        stop_ids: Optional[Sequence[int]] = None, max_new_tokens: int = 48,
                        max_batches: Optional[int] = None, examples: int = 0,
                        share: Tuple[int, int] = (0, 1), ctc_weight: float = 0.0,
                        hypotheses: bool = False, timing: bool = False) -> Dict[str, Dict[str, Any]]:
    """Each validation dataset scored by its loader's `metric` ("wer" without one) under
    its loader's `normaliser` (wer and exact; the project's own without one), plus one
    pooled entry per metric in use over the datasets that use it (keys: POOLED).
    `share` (index, count): this caller answers and scores every count-th sample of each
    batch from the index-th on (context-parallel ranks split a batch's samples so).
    `ctc_weight` > 0: joint CTC/attention decoding where the answer is the transcript
    (answer_batch).

    A dataset's entry: {"metric": name, <name>: score, <its statistics>, "seconds",
    "normaliser", "normaliser_from", "scorer"}, e.g. {"metric": "exact", "exact": 0.93, "correct": 186,
    "utterances": 200, ...}; with `examples` > 0 also the first few (reference,
    hypothesis) pairs; with `hypotheses`, every pair as {"reference", "hypothesis",
    "reference_normalised", "hypothesis_normalised"} ("hypotheses"; the normalised ones
    None for BLEU, which scores raw strings); with `timing`, "audio_seconds" and
    "decode_seconds" (decoding alone, after one warm-up batch of the first dataset that is
    decoded and thrown away: the first call pays for allocations and kernel choices) and
    "batch_samples" (the most samples answered together). A pooled entry: {"metric",
    <name>: score, <summed statistics>, "datasets": [names]}."""
    from orchestrator.plan.tasks import DEFAULT_NORMALISER, NORMALISED_METRICS
    from orchestrator.scoring.normalisers import describe, normaliser as normalising, scorer

    chosen = {name: metrics.check_metric(getattr(loader, "metric", "wer")) for name, loader in validation.items()}
    clash = sorted(set(chosen) & set(POOLED.values()))
    if clash:
        raise ValueError(f"validation datasets named {clash}: these names are the pooled entries of the report")
    stop_ids = list(stop_ids) if stop_ids is not None else default_stop_ids(tokenizer)
    if timing:
        for loader in itertools.islice(validation.values(), 1):
            for batch in itertools.islice(loader, 1):
                answer_batch(model, batch, tokenizer, stop_ids, max_new_tokens, share, ctc_weight)
    report: Dict[str, Dict[str, Any]] = {}
    for name, loader in validation.items():
        metric = chosen[name]
        normaliser = (getattr(loader, "normaliser", None) or DEFAULT_NORMALISER) if metric in NORMALISED_METRICS \
            else None
        started = time.perf_counter()
        refs: List[str] = []
        hyps: List[str] = []
        audio = decoding = 0.0
        widest = 0
        for batch in itertools.islice(loader, max_batches):  # not one batch more: peers read in step
            began = time.perf_counter()
            answers = answer_batch(model, batch, tokenizer, stop_ids, max_new_tokens, share, ctc_weight)
            decoding += time.perf_counter() - began
            if timing:
                audio += answered_audio_seconds(batch, share)
                widest = max(widest, len(answers))
            hyps += answers
            refs += list(batch["transcripts"])[share[0]::share[1]]
        stats = metrics.statistics(metric, refs, hyps, normaliser or DEFAULT_NORMALISER)
        entry: Dict[str, Any] = {"metric": metric, metric: metrics.score(metric, stats), **stats,
                                 "seconds": time.perf_counter() - started, "normaliser": normaliser,
                                 "normaliser_from": describe(normaliser) if normaliser else None,
                                 "scorer": scorer(metric)}
        if timing:
            entry.update(audio_seconds=audio, decode_seconds=decoding, batch_samples=widest)
        if examples:
            entry["examples"] = list(zip(refs[:examples], hyps[:examples]))
        if hypotheses:
            normalise = normalising(normaliser) if normaliser else None
            entry["hypotheses"] = [{"reference": r, "hypothesis": h,
                                    "reference_normalised": normalise(r) if normalise else None,
                                    "hypothesis_normalised": normalise(h) if normalise else None}
                                   for r, h in zip(refs, hyps)]
        report[name] = entry
    for metric, key in POOLED.items():
        names = [n for n in validation if chosen[n] == metric]
        if names:
            stats = metrics.add(metric, (report[n] for n in names))
            report[key] = {"metric": metric, metric: metrics.score(metric, stats), **stats, "datasets": names}
    return report
