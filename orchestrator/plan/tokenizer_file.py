"""The vocabulary of a local HF tokenizer directory, read from its tokenizer.json as
plain JSON (submit side: validation runs without transformers or torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional


class TokenizerFileError(ValueError):
    """tokenizer.json exists but cannot be read as a HF tokenizer."""


def read_vocabulary(tokenizer_dir: str | Path) -> Dict[str, int]:
    """{token: id} of the model vocabulary and the added (special) tokens. Raises
    FileNotFoundError when the directory has no tokenizer.json."""
    path = Path(tokenizer_dir) / "tokenizer.json"
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


def read_special_tokens(tokenizer_dir: str | Path) -> Dict[str, Optional[str]]:
    """{"bos_token": ..., "eos_token": ...} as the directory's tokenizer_config.json (else
    special_tokens_map.json) sets them: a token's text, or None where the file sets null
    (Qwen's bos_token). A key no file sets is left out: transformers' own default applies."""
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

