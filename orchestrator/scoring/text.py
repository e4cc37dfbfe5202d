"""Transcript normalisation applied to references and hypotheses before scoring.

Steps, in order:
  1. Unicode NFKC, lower case;
  2. apostrophes removed inside words ("don't" -> "dont");
  3. every other character that is not a letter or a digit becomes a space
     (punctuation, hyphens, symbols; tokenizer artefacts such as stray special-token
     text are removed with it);
  4. runs of whitespace collapse to one space; leading/trailing space dropped.

Digits are NOT spelled out: the demo corpus writes numbers as words ("three one"),
and a model that answers "3 1" is counted wrong on purpose (it did not learn the
transcript convention).
"""

from __future__ import annotations

import re
import unicodedata

_APOSTROPHES = re.compile(r"(?<=\w)['\u2019](?=\w)")
_NON_WORD = re.compile(r"[^\w]|_", re.UNICODE)
_SPACES = re.compile(r"\s+")


def normalize_transcript(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower()
    text = _APOSTROPHES.sub("", text)
    text = _NON_WORD.sub(" ", text)
    return _SPACES.sub(" ", text).strip()
