"""The vocabulary of a local HF tokenizer directory, read from its tokenizer.json (or a
Tekken tokenizer's tekken.json) as plain JSON (submit side: validation runs without
transformers or torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional


TEKKEN_FILE = "tekken.json"  # Mistral's tokenizer (Voxtral's): orchestrator/data/tekken.py reads it


# What reads tekken.json on the job side (orchestrator/data/tekken.py), and how to get it.
TEKKEN_INSTALL = "pip install 'mistral-common>=1.8,<1.14' (the project's extra: pip install -e '.[voxtral]')"


def is_tekken(tokenizer_dir) -> bool:
    """A directory whose tokenizer is Tekken's (tekken.json, no HF tokenizer.json)."""
    return bool(tokenizer_dir) and (Path(tokenizer_dir) / TEKKEN_FILE).is_file() and \
        not (Path(tokenizer_dir) / "tokenizer.json").is_file()


class TokenizerFileError(ValueError):
    """tokenizer.json exists but cannot be read as a HF tokenizer."""


def read_vocabulary(tokenizer_dir: str | Path) -> Dict[str, int]:
    """{token: id} of the model vocabulary and the added (special) tokens, of its
    tokenizer.json or, without one, of its tekken.json (read_tekken_vocabulary). Raises
    FileNotFoundError when the directory has neither."""
    path = Path(tokenizer_dir) / "tokenizer.json"
    if is_tekken(tokenizer_dir):
        return read_tekken_vocabulary(Path(tokenizer_dir) / TEKKEN_FILE)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found")
    try:
        data = json.loads(path.read_text())
        vocab = data["model"]["vocab"]
        # BPE / WordPiece / WordLevel: {token: id}; Unigram: [[token, score], ...] in id order.
        tokens = dict(vocab) if isinstance(vocab, dict) else {entry[0]: i for i, entry in enumerate(vocab)}
        tokens.update({t["content"]: int(t["id"]) for t in data.get("added_tokens", [])})
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise TokenizerFileError(f"{path} is not a HF tokenizer file ({type(exc).__name__}: {exc})") from exc
    return tokens


def read_tekken_vocabulary(path: Path) -> Dict[str, int]:
    """{token: id} of a Tekken file (Mistral's tokenizer: tekken.json): its special tokens
    (control tokens such as [INST] and [AUDIO]) at their ranks, then the first
    default_vocab_size - num_special of its byte-pair tokens (those with text) after them,
    as mistral-common numbers them. Files of the oldest format name no special tokens: the
    twenty every Tekken file has then (<unk>, <s>, </s>, [INST], [/INST], ...)."""
    try:
        data = json.loads(path.read_text())
        config = data["config"]
        specials = data.get("special_tokens") or [{"rank": i, "token_str": t} for i, t in enumerate(
            ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
             "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
             "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"])]
        offset = int(config.get("default_num_special_tokens") or len(specials))
        size = int(config.get("default_vocab_size") or offset + len(data["vocab"]))
        tokens = {entry["token_str"]: offset + int(entry["rank"]) for entry in data["vocab"][: size - offset]
                  if entry.get("token_str") is not None}
        tokens.update({t["token_str"]: int(t["rank"]) for t in specials})
    except (ValueError, KeyError, TypeError) as exc:
        raise TokenizerFileError(f"{path} is not a Tekken tokenizer file ({type(exc).__name__}: {exc})") from exc
    return tokens


def read_special_tokens(tokenizer_dir: str | Path) -> Dict[str, Optional[str]]:
    """{"bos_token": ..., "eos_token": ...} as the directory's tokenizer_config.json (else
    special_tokens_map.json) sets them: a token's text, or None where the file sets null
    (Qwen's bos_token). A key no file sets is left out: transformers' own default applies.
    A Tekken tokenizer's are <s> and </s>."""
    if is_tekken(tokenizer_dir):
        return {"bos_token": "<s>", "eos_token": "</s>"}
    found: Dict[str, Optional[str]] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the second wins
        path = Path(tokenizer_dir) / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise TokenizerFileError(f"{path} is not JSON ({exc})") from exc
        for key in ("bos_token", "eos_token"):
            if key in data:
                value = data[key]
                found[key] = value.get("content") if isinstance(value, dict) else value
    return found

