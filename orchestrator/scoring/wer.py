"""Word error rate over normalised transcripts (jiwer), under a chosen normaliser
(orchestrator/scoring/normalisers.py; the project's own by default).

WER = (substitutions + deletions + insertions) / reference words, pooled over all
pairs (not a mean of per-utterance rates). An empty hypothesis counts every
reference word as deleted; an empty reference is refused (no words to score).
"""

from __future__ import annotations

from typing import Dict, Sequence

from orchestrator.plan.tasks import DEFAULT_NORMALISER


def word_errors(references: Sequence[str], hypotheses: Sequence[str],
                normaliser: str = DEFAULT_NORMALISER) -> Dict[str, int]:
    """Pooled edit counts: {"errors", "words", "substitutions", "deletions", "insertions", "utterances"}."""
    import jiwer

    from orchestrator.scoring.normalisers import normaliser as normalising

    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    normalise = normalising(normaliser)
    refs = [normalise(r) for r in references]
    hyps = [normalise(h) for h in hypotheses]
    empty = [i for i, r in enumerate(refs) if not r]
    if empty:
        raise ValueError(f"references {empty[:10]} are empty after normalisation ({normaliser}): "
                         f"{[references[i] for i in empty[:3]]}; a WER needs reference words")
    counts = {"substitutions": 0, "deletions": 0, "insertions": 0, "words": 0, "utterances": len(refs)}
    if not refs:
        return {**counts, "errors": 0}
    # jiwer refuses empty hypotheses in a list; score those by hand (all deletions).
    scored = [i for i, h in enumerate(hyps) if h]
    for i, r in enumerate(refs):
        counts["words"] += len(r.split())
        if not hyps[i]:
            counts["deletions"] += len(r.split())
    if scored:
        out = jiwer.process_words([refs[i] for i in scored], [hyps[i] for i in scored])
        counts["substitutions"] += out.substitutions
        counts["deletions"] += out.deletions
        counts["insertions"] += out.insertions
    counts["errors"] = counts["substitutions"] + counts["deletions"] + counts["insertions"]
    return counts


def wer(references: Sequence[str], hypotheses: Sequence[str], normaliser: str = DEFAULT_NORMALISER) -> float:
    counts = word_errors(references, hypotheses, normaliser)
    return counts["errors"] / max(counts["words"], 1)
