"""A small byte-level BPE tokenizer with the chat-template and audio special tokens.

Saved as a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json),
loadable with `transformers.AutoTokenizer.from_pretrained(dir)`. Ids 0-3 follow
Gemma's layout (pad, eos, bos, unk); the turn markers and the audio placeholder
follow. Byte-level means every text is encodable, whatever the training corpus.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, List, Optional, Sequence

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
START_OF_TURN, END_OF_TURN = "<start_of_turn>", "<end_of_turn>"
AUDIO_TOKEN = "<audio>"  # one per adapter output frame; <SpeechHere> expands to a run of these
SPECIAL_TOKENS: List[str] = [PAD, EOS, BOS, UNK, START_OF_TURN, END_OF_TURN, AUDIO_TOKEN]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def build_tokenizer(texts: Iterable[str], out_dir: str | Path, vocab_size: int = 512,
                    special_tokens: Sequence[str] = tuple(SPECIAL_TOKENS)) -> Path:
    """Train byte-level BPE on `texts` (vocab <= vocab_size, specials included); save to out_dir.
    `special_tokens` take the first ids in order and must start with pad, eos, bos, unk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    special_tokens = list(special_tokens)
    if special_tokens[:4] != [PAD, EOS, BOS, UNK]:
        raise ValueError(f"special_tokens must start with {[PAD, EOS, BOS, UNK]}, got {special_tokens[:4]}")
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size ({vocab_size}) must hold the 256 byte tokens and "
                         f"{len(special_tokens)} special tokens: use at least {256 + len(special_tokens)}")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        additional_special_tokens=special_tokens[4:],
        chat_template=CHAT_TEMPLATE,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


def load_tokenizer(path: str | Path, audio_token: Optional[str] = None):
    """The HF tokenizer at a local directory (never downloads), or its Tekken tokenizer
    (orchestrator/data/tekken.py); with `audio_token`, it must know that placeholder as one
    token (data.audio_token)."""
    from transformers import AutoTokenizer

    from orchestrator.data.tekken import TekkenTokenizer
    from orchestrator.plan.tokenizer_file import is_tekken

    if not Path(path).is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist; set data.tokenizer to a local HF "
                                f"tokenizer directory (`audiollm data demo OUT_DIR` writes OUT_DIR/tokenizer)")
    if is_tekken(path):  # Mistral's and Voxtral's (tekken.json): through mistral-common
        tok = TekkenTokenizer(path)
    else:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if audio_token is not None and tok.convert_tokens_to_ids(audio_token) in (None, tok.unk_token_id):
        raise ValueError(f"data.audio_token={audio_token!r} is not a token of the tokenizer at {path}; choose one "
                         f"it has (for Gemma2 '<unused0>')")
    return tok
