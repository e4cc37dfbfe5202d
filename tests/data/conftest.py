"""Shared pieces of the data tests: a tiny tokenizer, tiny MDS datasets, configs."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import pytest
from omegaconf import OmegaConf

from orchestrator.data.audio import encode_flac
from orchestrator.plan.schema.data import DataConfig, DatasetEntry
from orchestrator.plan.schema.model import AdapterConfig, EncoderConfig

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "the", "cat", "sees", "dog"]
COLUMNS = {"audio": "bytes", "text": "str"}


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from orchestrator.data.tokenizer_build import build_tokenizer

    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5
    texts += [DataConfig().prompt_template.replace("<SpeechHere>", " ")] * 5
    return build_tokenizer(texts, tmp_path_factory.mktemp("tok") / "tokenizer", vocab_size=320)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from orchestrator.data.tokenizer_build import load_tokenizer

    return load_tokenizer(tokenizer_dir)


def tone(seconds: float, rate: int = 16000, freq: float = 440.0, seed: int = 0) -> np.ndarray:
    """A short test clip: a tone with a little noise (deterministic)."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * freq * t) + 0.01 * rng.standard_normal(t.shape)).astype(np.float32)


def write_mds(path: Path, samples: Sequence[Dict], columns: Optional[Dict[str, str]] = None,
              size_limit: int = 1 << 16) -> Path:
    from streaming import MDSWriter

    with MDSWriter(out=str(path), columns=columns or COLUMNS, size_limit=size_limit, progress_bar=False) as w:
        for s in samples:
            w.write(s)
    return path


def tone_samples(n: int, seed: int = 0, tag: str = "", min_s: float = 0.3, max_s: float = 1.5) -> List[Dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS[:10], size=int(rng.integers(1, 5))))
        secs = float(rng.uniform(min_s, max_s))
        out.append({"audio": encode_flac(tone(secs, freq=200 + 10 * i, seed=seed * 1000 + i), 16000),
                    "text": (tag + " " + words).strip()})
    return out


def data_config(train: Sequence[DatasetEntry] = (), validation: Sequence[DatasetEntry] = (), **overrides):
    cfg = OmegaConf.structured(DataConfig)
    cfg.train = [OmegaConf.structured(e) for e in train]
    cfg.validation = [OmegaConf.structured(e) for e in validation]
    cfg.seq_length = 128
    cfg.max_audio_seconds = 5.0
    cfg.packing_buffer = 32
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


@pytest.fixture(scope="session")
def encoder_cfg():
    # The tiny model's encoder window: 250 positions = 500 mel frames = 5 s.
    return OmegaConf.structured(EncoderConfig(d_model=64, num_layers=1, num_heads=2, ffn_dim=64, num_mel_bins=80,
                                              max_source_positions=250))


@pytest.fixture(scope="session")
def adapter_cfg():
    return OmegaConf.structured(AdapterConfig(frame_stack=5))


CONVERSATION_COLUMNS = {"turns": "json", "clip_a": "bytes", "clip_b": "bytes"}
FIRST_QUESTION, SECOND_QUESTION = "Transcribe:", "And <SpeechHere> in reverse?"


def conversation_samples(n: int, seed: int = 0) -> List[Dict]:
    """Two-turn conversations with two clips: the user sends clip_a ("Transcribe:"), the
    assistant answers its words; then clip_b at the marker of the second question, and
    the assistant answers other words."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        first = " ".join(rng.choice(WORDS[:10], size=int(rng.integers(1, 4))))
        second = " ".join(rng.choice(WORDS[10:], size=int(rng.integers(1, 4))))
        clips = {c: encode_flac(tone(float(rng.uniform(0.3, 1.2)), freq=300 + 20 * i + 7 * k, seed=seed * 100 + i),
                                16000) for k, c in enumerate(("clip_a", "clip_b"))}
        out.append({**clips, "turns": [
            {"role": "user", "text": FIRST_QUESTION, "audio": ["clip_a"]},
            {"role": "assistant", "text": first},
            {"role": "user", "text": SECOND_QUESTION, "audio": ["clip_b"]},
            {"role": "assistant", "text": second}]})
    return out


def instructed_samples(n: int, seed: int = 0) -> List[Dict]:
    """Tone clips whose `instruction` column varies per sample and whose answer is in
    column `answer` (a dataset with its own template, columns and prompts)."""
    samples = tone_samples(n, seed=seed)
    return [{"audio": s["audio"], "answer": s["text"].split()[0], "instruction": f"Say word {k % 3}"}
            for k, s in enumerate(samples)]


INSTRUCTED_COLUMNS = {"audio": "bytes", "answer": "str", "instruction": "str"}
INSTRUCTED_TEMPLATE = "<start_of_turn>user\n{instruction}: <SpeechHere><end_of_turn>\n<start_of_turn>model\n"
