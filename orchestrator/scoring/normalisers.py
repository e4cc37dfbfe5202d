"""The text normalisers a validation dataset's WER and exact match are scored under
(its `normaliser`: orchestrator/plan/tasks.py NORMALISERS), and the names of the scorers
that count them, which the eval JSON and the model card carry beside each figure.

  audiollm         the project's own (orchestrator/scoring/text.py): case, punctuation,
                   apostrophes; numbers stay as written. The default: the demo corpus
                   spells numbers as words, and a model that answers "3" for "three" has
                   not learned its convention.
  whisper_english  Whisper's EnglishTextNormalizer, as the Open ASR Leaderboard scores:
                   numbers to digits ("twenty five percent" -> "25%"), British to American
                   spelling, contractions and titles expanded, fillers ("uh", "um") dropped.
  whisper_basic    Whisper's BasicTextNormalizer: lower case, bracketed text and
                   punctuation removed; nothing else.

The Whisper ones are transformers' own classes
(transformers.models.whisper.english_normalizer), not rewritten here. The English one
needs Whisper's spelling table, which the transformers wheel does not ship (a Whisper
repository's tokenizer files carry it as normalizer.json): whisper_english.json beside
this module is openai-whisper's whisper/normalizers/english.json, copied unchanged under
its MIT licence (whisper_english.LICENSE names the release and the file's sha256), so
scoring needs no network and no openai-whisper (which brings numba and tiktoken).

Every normaliser's output has its whitespace collapsed (BasicTextNormalizer leaves
trailing spaces): jiwer splits on whitespace anyway, so the counts are the same; the
stored normalised hypotheses (audiollm eval's JSONL) are cleaner, and an empty string
means "nothing left" for every normaliser.
"""

from __future__ import annotations

import functools
import json
from importlib import metadata
from pathlib import Path
from typing import Callable

from orchestrator.plan.tasks import DEFAULT_NORMALISER, NORMALISERS
from orchestrator.scoring.text import normalize_transcript

SPELLING_TABLE = Path(__file__).with_name("whisper_english.json")


def check_normaliser(name: str) -> str:
    if name not in NORMALISERS:
        raise ValueError(f"unknown normaliser {name!r}; use one of {', '.join(NORMALISERS)}")
    return name


@functools.lru_cache(maxsize=None)
def normaliser(name: str = DEFAULT_NORMALISER) -> Callable[[str], str]:
    """The normalising function of `name` (made once per process: the English one reads
    its spelling table and compiles its patterns)."""
    check_normaliser(name)
    if name == "audiollm":
        return normalize_transcript
    from transformers.models.whisper.english_normalizer import BasicTextNormalizer, EnglishTextNormalizer

    whisper = (EnglishTextNormalizer(json.loads(SPELLING_TABLE.read_text(encoding="utf-8")))
               if name == "whisper_english" else BasicTextNormalizer())
    return lambda text: " ".join(whisper(text).split())


def describe(name: str) -> str:
    """Where a normaliser comes from, for the eval JSON and the model card."""
    check_normaliser(name)
    if name == "audiollm":
        return "the project's own, orchestrator/scoring/text.py"
    cls = "EnglishTextNormalizer" if name == "whisper_english" else "BasicTextNormalizer"
    table = ", with Whisper's english.json (openai-whisper 20250625)" if name == "whisper_english" else ""
    return f"transformers {_version('transformers')} {cls}{table}"


def scorer(metric: str) -> str:
    """What counted a metric's statistics, with its version."""
    if metric == "wer":
        return f"jiwer {_version('jiwer')} (process_words, pooled over utterances)"
    if metric == "exact":
        return "exact match of the normalised strings (orchestrator/scoring/metrics.py)"
    return f"sacrebleu {_version('sacrebleu')} corpus BLEU (13a, raw strings)"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(version unknown)"
