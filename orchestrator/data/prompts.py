"""Prompt expansion, tokenization and loss masks for one sample.

A sample = the prompt template with <SpeechHere> replaced by a run of audio
placeholder tokens (one per adapter output frame), then the transcript, the
response suffix and eos. Megatron convention: `tokens` = ids[:-1], `labels` =
ids[1:], `loss_mask[i]` says whether labels[i] is trained (by default only the
response: transcript, suffix and eos).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence

import numpy as np

from orchestrator.data.frames import audio_placeholder_count  # noqa: F401  (re-exported)

SPEECH_MARKER = "<SpeechHere>"


@dataclass
class Tokenized:
    tokens: np.ndarray  # int64 [L]
    labels: np.ndarray  # int64 [L]
    loss_mask: np.ndarray  # float32 [L]
    audio_tokens: List[int] = field(default_factory=list)  # placeholders per clip, in order

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class PromptBuilder:
    """Tokenizes the fixed parts of the template once; builds each sample from ids."""

    def __init__(self, tokenizer, template: str, response_suffix: str = "<end_of_turn>", add_bos: bool = True,
                 add_eos: bool = True, loss_on_prompt: bool = False, audio_token: str = "<audio>"):
        if template.count(SPEECH_MARKER) != 1:
            raise ValueError(f"data.prompt_template must contain {SPEECH_MARKER} exactly once "
                             f"(found {template.count(SPEECH_MARKER)}): {template!r}")
        self.tokenizer = tokenizer
        self.audio_token_id = tokenizer.convert_tokens_to_ids(audio_token)
        if self.audio_token_id is None or self.audio_token_id == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no audio placeholder token {audio_token!r}")
        before, after = template.split(SPEECH_MARKER)
        self.before = self._encode(before)
        self.after = self._encode(after)
        if add_bos:
            if tokenizer.bos_token_id is None:
                raise ValueError("data.add_bos=true but the tokenizer has no bos token")
            self.before = [tokenizer.bos_token_id] + self.before
        self.suffix = self._encode(response_suffix)
        if add_eos:
            if tokenizer.eos_token_id is None:
                raise ValueError("data.add_eos=true but the tokenizer has no eos token")
            self.suffix = self.suffix + [tokenizer.eos_token_id]
        self.loss_on_prompt = loss_on_prompt

    def _encode(self, text: str) -> List[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def build(self, transcript: str, audio_tokens: Sequence[int]) -> Tokenized:
        """audio_tokens: placeholders per clip (a chunked long clip gives several runs back to back)."""
        if not transcript or not transcript.strip():
            raise ValueError("empty transcript")
        answer = self._encode(transcript.strip()) + self.suffix
        audio = [self.audio_token_id] * int(sum(audio_tokens))
        prompt = self.before + audio + self.after
        ids = np.asarray(prompt + answer, dtype=np.int64)
        trained = np.zeros(ids.shape[0], dtype=np.float32)
        trained[len(prompt):] = 1.0
        if self.loss_on_prompt:
            trained[:] = 1.0
            trained[ids == self.audio_token_id] = 0.0  # placeholders are never targets
        return Tokenized(ids[:-1], ids[1:], trained[1:], list(int(n) for n in audio_tokens))
