"""Prompt expansion, tokenization and loss masks for one sample.

A single-clip sample (`PromptBuilder`) = the prompt template with <SpeechHere>
replaced by a run of audio placeholder tokens (one per adapter output frame), then
the answer, the response suffix and eos. A conversation (`ConversationBuilder`) = the
tokenizer's chat template over its turns, each audio segment a run of placeholders
where its marker is. Megatron convention: `tokens` = ids[:-1], `labels` = ids[1:],
`loss_mask[i]` says whether labels[i] is trained (by default only the answers:
their text, end of turn and eos).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from orchestrator.data.frames import audio_placeholder_count  # noqa: F401  (re-exported)
from orchestrator.plan.tasks import INSTRUCTION_SLOT, SPEECH_MARKER


@dataclass
class Tokenized:
    tokens: np.ndarray  # int64 [L]
    labels: np.ndarray  # int64 [L]
    loss_mask: np.ndarray  # float32 [L]
    audio_tokens: List[int] = field(default_factory=list)  # placeholders per clip, in order
    # Index into ids (= tokens + the last label) of the scored answer's first token:
    # generation is prompted with ids[:answer_start]; `reference` is that answer's text.
    answer_start: int = 0
    reference: str = ""
    ctc: bool = False  # the clips' transcript is the answer (joint CTC targets)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def audio_token_id(tokenizer, audio_token: str) -> int:
    token_id = tokenizer.convert_tokens_to_ids(audio_token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(f"the tokenizer has no audio placeholder token {audio_token!r}")
    return int(token_id)


def encode_text(tokenizer, text: str) -> List[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def chat_user_template(tokenizer, instruction: str) -> str:
    """A template from a user-turn instruction, in the tokenizer's chat format (the
    generation prompt for the model's answer follows the user turn)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat template (tokenizer_config.json 'chat_template'); a task "
                         "preset or a conversation dataset needs one, or give the dataset its own prompt_template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": instruction}], tokenize=False,
                                         add_generation_prompt=True)
    bos = tokenizer.bos_token
    return text[len(bos):] if bos and text.startswith(bos) else text  # bos is data.add_bos's


def _sample_arrays(ids: List[int], trained: List[bool], answer_start: int, reference: str,
                   audio_tokens: Sequence[int], ctc: bool) -> Tokenized:
    ids_arr = np.asarray(ids, dtype=np.int64)
    mask = np.asarray(trained, dtype=np.float32)
    return Tokenized(ids_arr[:-1], ids_arr[1:], mask[1:], [int(n) for n in audio_tokens], answer_start,
                     reference, ctc)


class PromptBuilder:
    """One clip, one answer: tokenizes the fixed parts of the template once and builds
    each sample from ids. A template with {instruction} is completed per sample."""

    def __init__(self, tokenizer, template: str, response_suffix: str = "<end_of_turn>", add_bos: bool = True,
                 add_eos: bool = True, loss_on_prompt: bool = False, audio_token: str = "<audio>",
                 ctc: bool = False):
        if template.count(SPEECH_MARKER) != 1:
            raise ValueError(f"data.prompt_template must contain {SPEECH_MARKER} exactly once "
                             f"(found {template.count(SPEECH_MARKER)}): {template!r}")
        self.tokenizer = tokenizer
        self.audio_token_id = audio_token_id(tokenizer, audio_token)
        self.template = template
        self.bos: List[int] = []
        if add_bos:
            if tokenizer.bos_token_id is None:
                raise ValueError("data.add_bos=true but the tokenizer has no bos token")
            self.bos = [tokenizer.bos_token_id]
        self.before, self.after = (None, None) if INSTRUCTION_SLOT in template else self._split(template)
        self.suffix = encode_text(tokenizer, response_suffix)
        if add_eos:
            if tokenizer.eos_token_id is None:
                raise ValueError("data.add_eos=true but the tokenizer has no eos token")
            self.suffix = self.suffix + [tokenizer.eos_token_id]
        self.loss_on_prompt, self.ctc = loss_on_prompt, ctc

    def _split(self, template: str) -> Tuple[List[int], List[int]]:
        before, after = template.split(SPEECH_MARKER)
        return self.bos + encode_text(self.tokenizer, before), encode_text(self.tokenizer, after)

    def build(self, answer: str, audio_tokens: Sequence[int], instruction: Optional[str] = None) -> Tokenized:
        """audio_tokens: placeholders per clip (a chunked long clip gives several runs back to back)."""
        if not answer or not answer.strip():
            raise ValueError("empty answer")
        before, after = self.before, self.after
        if before is None:
            if not isinstance(instruction, str) or not instruction.strip():
                raise ValueError(f"empty instruction for the template's {INSTRUCTION_SLOT}")
            before, after = self._split(self.template.replace(INSTRUCTION_SLOT, instruction.strip()))
        prompt = before + [self.audio_token_id] * int(sum(audio_tokens)) + after
        ids = prompt + encode_text(self.tokenizer, answer.strip()) + self.suffix
        trained = [self.loss_on_prompt] * len(prompt) + [True] * (len(ids) - len(prompt))
        if self.loss_on_prompt:
            trained = [t and i != self.audio_token_id for t, i in zip(trained, ids)]  # placeholders are never targets
        return _sample_arrays(ids, trained, len(prompt), answer.strip(), audio_tokens, self.ctc)


class ConversationBuilder:
    """Turns -> one sample through the tokenizer's chat template. Each assistant turn's
    span (its text and end-of-turn marker, as the template renders them after the
    generation prompt) is trained unless the turn says `train: false`; every audio
    segment becomes its clips' placeholder runs at its <SpeechHere> marker (or, with no
    marker in the turn, before the turn's text)."""

    def __init__(self, tokenizer, add_bos: bool = True, add_eos: bool = True, loss_on_prompt: bool = False,
                 audio_token: str = "<audio>"):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template (tokenizer_config.json 'chat_template'); "
                             "conversation datasets are rendered with it")
        self.tokenizer = tokenizer
        self.audio_token_id = audio_token_id(tokenizer, audio_token)
        if add_bos and tokenizer.bos_token_id is None:
            raise ValueError("data.add_bos=true but the tokenizer has no bos token")
        if add_eos and tokenizer.eos_token_id is None:
            raise ValueError("data.add_eos=true but the tokenizer has no eos token")
        self.add_bos, self.add_eos, self.loss_on_prompt = add_bos, add_eos, loss_on_prompt

    def _render(self, messages: List[Dict[str, str]], generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def build(self, turns: Sequence[Dict[str, Any]], segment_tokens: Mapping[str, Sequence[int]]) -> Tokenized:
        """turns: checked by tasks.conversation_problems; segment_tokens[column]:
        placeholders per clip of the audio segment in that column (a chunked long
        segment has several clips)."""
        messages, order = [], []  # order: the segments in the order their markers appear
        for turn in turns:
            text, audio = turn.get("text", ""), list(turn.get("audio") or [])
            if audio and SPEECH_MARKER not in text:
                text = SPEECH_MARKER * len(audio) + text
            messages.append({"role": turn["role"], "content": text})
            order += audio
        full = self._render(messages)
        spans = []  # (start, end, turn index) of trained assistant text in `full`
        for k, turn in enumerate(turns):
            if turn["role"] != "assistant":
                continue
            prefix, upto = self._render(messages[:k], True), self._render(messages[:k + 1])
            if not (upto.startswith(prefix) and full.startswith(upto)):
                raise ValueError("the tokenizer's chat template does not render a conversation prefix by prefix "
                                 f"(turn {k}): the assistant turns cannot be located for the loss mask")
            spans.append((len(prefix), len(upto.rstrip()), k))
        # Cut `full` at every span boundary and marker; text pieces are tokenized alone.
        cuts = sorted({0, len(full)} | {c for a, b, _ in spans for c in (a, b)})
        ids: List[int] = []
        trained: List[bool] = []
        starts: Dict[int, int] = {}  # turn index -> ids index where its answer starts
        segments = iter(order)
        clip_tokens: List[int] = []
        if self.add_bos and not (self.tokenizer.bos_token and full.startswith(self.tokenizer.bos_token)):
            ids, trained = [self.tokenizer.bos_token_id], [False]
        for a, b in zip(cuts[:-1], cuts[1:]):
            span = next((s for s in spans if s[0] <= a and b <= s[1]), None)
            train = span is not None and turns[span[2]].get("train", True) is not False
            if span is not None and a == span[0]:
                starts[span[2]] = len(ids)
            for i, piece in enumerate(full[a:b].split(SPEECH_MARKER)):
                if i:
                    runs = [int(n) for n in segment_tokens[next(segments)]]
                    clip_tokens += runs
                    ids += [self.audio_token_id] * sum(runs)
                    trained += [False] * sum(runs)
                piece_ids = encode_text(self.tokenizer, piece)
                ids += piece_ids
                trained += [train or self.loss_on_prompt] * len(piece_ids)
        if self.add_eos:
            final = turns[-1]  # eos ends the conversation: trained with a trained final answer
            ids.append(self.tokenizer.eos_token_id)
            trained.append(self.loss_on_prompt or (final["role"] == "assistant" and final.get("train", True) is not False))
        scored = [k for _, _, k in spans if turns[k].get("train", True) is not False] or [spans[-1][2]]
        last = scored[-1]
        return _sample_arrays(ids, trained, starts[last], str(turns[last].get("text", "")).strip(), clip_tokens,
                              False)
