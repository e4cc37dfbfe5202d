"""A recording longer than the encoder's window, answered window by window: where to cut
it, and how to join the answers. Shared by `audiollm transcribe` (run checkpoints and
exported models alike) and an exported model's pipeline, which carries this file as
remote code (numpy only).

Cutting: each window ends where the audio is quietest within its last fifth (the 20-ms
frame of least energy: a pause between words, where a cut meets no word), and the next
window starts a tenth of the window before that cut, so that a word the cut meets anyway is
heard whole by one of the two. Joining: the words the overlap repeats are said once: the
longest run of words that ends one answer and begins the next (compared without case and
punctuation; the first answer's last word may be the start of the next one's, a word the
cut went through), or else the longest run of two words or more the two share near their
edges, the words of the first answer after it (the cut edge, heard in part) left out.

Limits: a cut lands in the quietest frame the search region has, which in continuous
speech may still be inside a word (the overlap is then what saves it); an answer that hears
the overlap differently from the one before (another spelling, a word missed) joins at the
longest run they share, and with none (an overlap heard as nothing, or answers with no
word in common) both are kept whole, so a word may be said twice."""

from __future__ import annotations

import re
from difflib import SequenceMatcher
from typing import List, Sequence, Tuple

import numpy as np

FRAME = 320  # 20 ms at 16 kHz: the energy is compared frame by frame
SEARCH_FRACTION = 5  # a window's cut is looked for in its last 1/5
OVERLAP_FRACTION = 10  # and the next window starts 1/10 of a window before it
MERGE_WORDS = 16  # the words at each edge where a repeat is looked for
_PUNCTUATION = re.compile(r"[^\w']+")


def windows(samples: np.ndarray, window: int) -> List[Tuple[int, int]]:
    """[(start, end)] sample ranges covering `samples`, each at most `window` long; one
    range when the recording fits the window."""
    n = len(samples)
    search, overlap = window // SEARCH_FRACTION, window // OVERLAP_FRACTION
    out, start = [], 0
    while start + window < n:
        low = start + window - search
        region = np.asarray(samples[low:start + window], dtype=np.float64)
        count = len(region) // FRAME
        if count == 0:  # a window too short to search in: cut at its end
            cut = start + window
        else:
            energy = (region[:count * FRAME].reshape(count, FRAME) ** 2).mean(axis=1)
            cut = low + int(np.argmin(energy)) * FRAME + FRAME // 2
        out.append((start, cut))
        start = cut - overlap
    out.append((start, n))
    return out


def _key(word: str) -> str:
    return _PUNCTUATION.sub("", word.lower())


def _join_at(before: Sequence[str], after: Sequence[str]) -> Tuple[int, int]:
    """(words of `before` kept, words of `after` skipped) so that the words both heard in
    the overlap are said once."""
    tail, head = [_key(w) for w in before[-MERGE_WORDS:]], [_key(w) for w in after[:MERGE_WORDS]]
    for size in range(min(len(tail), len(head)), 0, -1):
        ends, begins = tail[-size:], head[:size]
        # The last word `before` heard may be the start of one the cut went through ("fi" of
        # "five"): then the next answer's whole word stands for it. (Over two words or more
        # only: one short word that begins another is as likely chance.)
        partial = size >= 2 and len(ends[-1]) >= 2 and begins[-1].startswith(ends[-1])
        if ends[:-1] == begins[:-1] and (ends[-1] == begins[-1] or partial):
            return len(before) - 1, size - 1
    match = SequenceMatcher(None, tail, head, autojunk=False).find_longest_match(0, len(tail), 0, len(head))
    if match.size >= 2:  # one shared word near the edges is as likely chance as a repeat
        return len(before) - len(tail) + match.a + match.size, match.b + match.size
    return len(before), 0


def merge(answers: Sequence[str]) -> str:
    """The answers of consecutive overlapping windows as one text."""
    words: List[str] = []
    for answer in answers:
        new = answer.split()
        keep, skip = _join_at(words, new)
        words = words[:keep] + new[skip:]
    return " ".join(words)
