"""A small byte-level BPE tokenizer with the chat-template and audio special tokens.

Saved as a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json),
loadable with `transformers.AutoTokenizer.from_pretrained(dir)`. Ids 0-3 follow
Gemma's layout (pad, eos, bos, unk); the turn markers and the audio placeholder
follow. Byte-level means every text is encodable, whatever the training corpus.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, List

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


def build_tokenizer(texts: Iterable[str], out_dir: str | Path, vocab_size: int = 512) -> Path:
    """Train byte-level BPE on `texts` (vocab <= vocab_size, specials included); save to out_dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size ({vocab_size}) must hold the 256 byte tokens and "
                         f"{len(SPECIAL_TOKENS)} special tokens: use at least {256 + len(SPECIAL_TOKENS)}")
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        additional_special_tokens=[START_OF_TURN, END_OF_TURN, AUDIO_TOKEN],
        chat_template=CHAT_TEMPLATE,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return out


def load_tokenizer(path: str | Path):
    """The HF tokenizer at a local directory (never downloads)."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist; set data.tokenizer to a local HF "
                                f"tokenizer directory (`audiollm data demo OUT_DIR` writes OUT_DIR/tokenizer)")
    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    missing = [t for t in (AUDIO_TOKEN,) if tok.convert_tokens_to_ids(t) in (None, tok.unk_token_id)]
    if missing:
        raise ValueError(f"tokenizer at {path} has no {missing} token; the audio placeholder must be a "
                         f"special token of the tokenizer")
    return tok
