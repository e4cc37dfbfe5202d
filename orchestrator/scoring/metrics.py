"""Validation metrics of generated answers, as summable statistics.

Each metric turns (references, hypotheses) into integer counts that add up over
batches, datasets and data-parallel ranks (`statistics`, `add`), and the summed
counts into the score (`score`): the score of a sum is the score of the pooled
corpus, not a mean of per-rank or per-dataset scores. Every metric counts
`utterances`.

  wer    word error rate (orchestrator.scoring.wer): errors / reference words, both sides
         normalised by the dataset's normaliser (orchestrator.scoring.normalisers; the
         project's own, orchestrator.scoring.text, by default). A fraction; lower is better.
  exact  exact match after the same normaliser on both sides (the project's: "Three-One."
         matches "three one"; "31" does not match "thirty one"; Whisper's English one
         makes both "31"): correct / utterances. A fraction.
  bleu   sacrebleu's corpus BLEU with its defaults (13a tokenisation, case-sensitive,
         exp smoothing, 4-grams) on the raw strings: the figure the sacrebleu command
         line prints for the same outputs, so comparable with published numbers; case
         and punctuation count, as they do in captions and translations (normalising
         them away would inflate the score against those). Statistics are sacrebleu's
         own: n-gram matches (`counts_n`) and hypothesis n-grams (`totals_n`), n = 1..4,
         `sys_len` and `ref_len`. Score 0..100, as sacrebleu reports it. A corpus
         whose answers have no 4-gram at all (every answer under 4 tokens) scores 0:
         short answers want `exact`. 13a suits space-separated languages; Chinese or
         Japanese references need sacrebleu's zh / ja-mecab tokenisers, which this
         metric does not pick.

An empty reference (after normalisation for wer and exact, after strip for bleu) is
refused: it means a dataset without its answer column, which would otherwise score as
silently wrong or right.
"""

from __future__ import annotations

from typing import Dict, Iterable, Mapping, Sequence, Tuple

from orchestrator.scoring.wer import word_errors
from orchestrator.plan.tasks import DEFAULT_NORMALISER, METRICS  # what a dataset may name (validated at planning)

_NGRAMS = 4
_STATISTICS = {
    "wer": ("errors", "words", "substitutions", "deletions", "insertions", "utterances"),
    "exact": ("correct", "utterances"),
    "bleu": (*(f"counts_{n}" for n in range(1, _NGRAMS + 1)), *(f"totals_{n}" for n in range(1, _NGRAMS + 1)),
             "sys_len", "ref_len", "utterances"),
}


def check_metric(metric: str) -> str:
    if metric not in METRICS:
        raise ValueError(f"unknown validation metric {metric!r}; use one of {', '.join(METRICS)}")
    return metric


def statistic_names(metric: str) -> Tuple[str, ...]:
    """The statistics of `metric`, in a fixed order (the layout of the all-reduce)."""
    return _STATISTICS[check_metric(metric)]


def statistics(metric: str, references: Sequence[str], hypotheses: Sequence[str],
               normaliser: str = DEFAULT_NORMALISER) -> Dict[str, int]:
    """Summable statistics of the pairs, keyed as statistic_names(metric); `normaliser`
    (orchestrator.scoring.normalisers) for wer and exact, BLEU reads the raw strings."""
    check_metric(metric)
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    if metric == "wer":
        counts = word_errors(references, hypotheses, normaliser)
    elif metric == "exact":
        counts = _exact(references, hypotheses, normaliser)
    else:
        counts = _bleu(references, hypotheses)
    return {k: counts[k] for k in _STATISTICS[metric]}


def add(metric: str, parts: Iterable[Mapping[str, float]]) -> Dict[str, float]:
    """The sum of several statistics of one metric (datasets pooled)."""
    total = dict.fromkeys(statistic_names(metric), 0)
    for part in parts:
        for k in total:
            total[k] += part[k]
    return total


def score(metric: str, stats: Mapping[str, float]) -> float:
    """The score of summed statistics; 0 when there is nothing to score."""
    check_metric(metric)
    if metric == "wer":
        return stats["errors"] / max(stats["words"], 1)
    if metric == "exact":
        return stats["correct"] / max(stats["utterances"], 1)
    # All-reduced statistics arrive as floats; the counts are whole numbers.
    counts = [round(stats[f"counts_{n}"]) for n in range(1, _NGRAMS + 1)]
    totals = [round(stats[f"totals_{n}"]) for n in range(1, _NGRAMS + 1)]
    bleu = _sacrebleu_bleu()
    return float(bleu.compute_bleu(counts, totals, round(stats["sys_len"]), round(stats["ref_len"]),
                                    smooth_method=bleu.smooth_method, smooth_value=bleu.smooth_value,
                                    effective_order=bleu.effective_order, max_ngram_order=bleu.max_ngram_order).score)


def _exact(references: Sequence[str], hypotheses: Sequence[str], normaliser: str) -> Dict[str, int]:
    from orchestrator.scoring.normalisers import normaliser as normalising

    normalise = normalising(normaliser)
    refs = [normalise(r) for r in references]
    empty = [i for i, r in enumerate(refs) if not r]
    if empty:
        raise ValueError(f"references {empty[:10]} are empty after normalisation ({normaliser}); an exact match "
                         f"needs a reference")
    correct = sum(r == normalise(h) for r, h in zip(refs, hypotheses))
    return {"correct": correct, "utterances": len(refs)}


def _sacrebleu_bleu():
    """The one BLEU configuration of both statistics and score (sacrebleu's defaults).
    Imported here, not at the top: the submit side imports this package."""
    from sacrebleu.metrics import BLEU

    return BLEU()


def _bleu(references: Sequence[str], hypotheses: Sequence[str]) -> Dict[str, int]:
    empty = [i for i, r in enumerate(references) if not r.strip()]
    if empty:
        raise ValueError(f"references {empty[:10]} are empty; a BLEU needs reference text")
    out = {"utterances": len(references)}
    if not references:
        return {**out, **dict.fromkeys(_STATISTICS["bleu"][:-1], 0)}
    corpus = _sacrebleu_bleu().corpus_score(list(hypotheses), [list(references)])
    for n in range(_NGRAMS):
        out[f"counts_{n + 1}"] = int(corpus.counts[n])
        out[f"totals_{n + 1}"] = int(corpus.totals[n])
    return {**out, "sys_len": int(corpus.sys_len), "ref_len": int(corpus.ref_len)}
