"""A Tekken tokenizer (tekken.json: Mistral's, Voxtral's) as the data path uses a HF
tokenizer, through mistral-common's Tekkenizer, which is what transformers' Voxtral
processor encodes with.

Two things a HF tokenizer does that Tekken's own encoder does not, done here as a HF
tokenizer does them for its special tokens:
  - a control token written in text ("[INST]", "[BEGIN_AUDIO]", "[TRANSCRIBE]", ...) is
    that token, so data.prompt_template can be written as text
    ("[INST][BEGIN_AUDIO]<SpeechHere>[/INST]lang:en[TRANSCRIBE]"); Tekken encodes the
    plain text around them ("lang:en") as mistral-common's transcription request does;
  - convert_tokens_to_ids knows the control tokens (transformers' MistralCommonTokenizer
    of 4.57 asserts on them, and misses the special tokens' offset for the others).
Needs the mistral-common package (`pip install 'audiollm[voxtral]'`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Sequence, Union

from orchestrator.plan.tokenizer_file import TEKKEN_FILE, TEKKEN_INSTALL


class TekkenTokenizer:
    """The HF tokenizer interface the project's data path, scoring and generation use
    (ids of bos/eos/pad/unk, __call__, convert_tokens_to_ids, decode), over a Tekkenizer.
    No chat template: a conversation dataset needs a tokenizer that has one."""

    chat_template = None
    bos_token, eos_token, pad_token, unk_token = "<s>", "</s>", "<pad>", "<unk>"

    def __init__(self, directory: Union[str, Path]):
        try:
            from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
            from mistral_common.tokens.tokenizers.tekken import Tekkenizer
        except ImportError as exc:
            raise ImportError(f"{directory} holds a Tekken tokenizer ({TEKKEN_FILE}), which is read with "
                              f"mistral-common: {TEKKEN_INSTALL}") from exc
        self.tekken = Tekkenizer.from_file(str(Path(directory) / TEKKEN_FILE))
        self._policies = {True: SpecialTokenPolicy.IGNORE, False: SpecialTokenPolicy.KEEP}  # by skip_special_tokens
        # Every special token by name but the unnamed fillers (<SPECIAL_123>), longest first so
        # that a name inside another ([AUDIO] in [BEGIN_AUDIO]) is not split out of it.
        self.controls: Dict[str, int] = {}
        for token_id in sorted(self.tekken.special_ids):
            name = self.tekken.id_to_piece(token_id)
            if not name.startswith("<SPECIAL_"):
                self.controls[name] = int(token_id)
        self._split = re.compile("(" + "|".join(re.escape(n) for n in sorted(self.controls, key=len, reverse=True))
                                 + ")")
        self.bos_token_id, self.eos_token_id = self.tekken.bos_id, self.tekken.eos_id
        self.pad_token_id, self.unk_token_id = self.tekken.pad_id, self.tekken.unk_id
        self.all_special_ids = sorted(self.controls.values())

    def __len__(self) -> int:
        return self.tekken.n_words

    def encode_text(self, text: str) -> List[int]:
        ids: List[int] = []
        for piece in self._split.split(text):
            if piece in self.controls:
                ids.append(self.controls[piece])
            elif piece:
                ids += self.tekken.encode(piece, bos=False, eos=False)
        return ids

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        ids = self.encode_text(text)
        if add_special_tokens:  # as MistralCommonTokenizer: BOS and EOS around
            ids = [self.bos_token_id, *ids, self.eos_token_id]
        return {"input_ids": ids}

    def convert_tokens_to_ids(self, tokens: Union[str, Sequence[str]]):
        if isinstance(tokens, str):
            if tokens in self.controls:
                return self.controls[tokens]
            ids = self.tekken.encode(tokens, bos=False, eos=False)
            return ids[0] if len(ids) == 1 else self.unk_token_id
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tekken.decode([int(i) for i in ids], self._policies[bool(skip_special_tokens)])

    def batch_decode(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = False) -> List[str]:
        return [self.decode(ids, skip_special_tokens) for ids in batch]
