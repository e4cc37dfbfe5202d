"""The espeak-ng demo corpus: real synthetic speech as several MDS datasets.

Two tasks, spoken by espeak-ng voices = English accent x voice variant, at random
speed (140-190 words/min) and pitch (30-70):

  digits     3-8 digits read as words; transcript "three one four one five"
  sentences  a short sentence from a small grammar; transcript lower-case words

Transcripts are lower-case words separated by single spaces, no punctuation, so
word error rate compares words directly.

A second task on the same audio: every digits dataset has a numerals twin (same
clips, same order) whose samples also carry `number`, the digits as numerals
("31415"): conf/data/demo.yaml asks "What number was said?" of them and scores the
answer by exact match. The twin is a directory of its own because mosaic refuses one
local directory in two streams of a mixture.

Training uses 6 accents x 8 variants = 48 voices, written as four datasets
(task x accent family). Validation is on voices never heard in training:
  *_heldout_accent   accents en-gb-scotland and en-029 (Caribbean), training variants
  *_heldout_variant  training accents with variants m5 and f3

An accent corpus (`--accent VOICE`, the fine-tuning demo: speech the default model
never heard) has one espeak-ng voice's accent only, training variants for training and
the held-out variants, with other sentences, for validation:
  train/{digits,sentences}_ACCENT/   val/{digits,sentences}_ACCENT_heldout/ (no numerals twins)

Layout of OUT_DIR:
  train/{digits_us,digits_gb,sentences_us,sentences_gb}/   MDS (index.json + shards)
  train/{numerals_us,numerals_gb}/                         the digits datasets + `number`
  val/{digits,sentences,numerals}_heldout_{accent,variant}/  MDS
  tokenizer/                                               HF tokenizer directory
  manifest.json                                            seed, counts, voices, timing

Each sample: audio (16-kHz mono 16-bit FLAC bytes), text, voice, accent, variant,
speed, pitch, duration (s). The corpus is a pure function of (num_samples,
num_val_samples, seed): same arguments, same bytes, whatever the worker count.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from orchestrator.plan.model_params import SAMPLE_RATE

TRAIN_ACCENTS = {"us": ["en-us", "en-us-nyc"], "gb": ["en-gb", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd"]}
TRAIN_VARIANTS = ["m1", "m2", "m3", "m4", "m7", "f1", "f2", "f4"]
HELDOUT_ACCENTS = ["en-gb-scotland", "en-029"]
HELDOUT_VARIANTS = ["m5", "f3"]
TASKS = ("digits", "sentences")
# Bumped when the corpus layout or content changes (2: the numerals datasets; 3: the
# held-out utterances drawn apart from the training ones); `audiollm train` refuses a
# corpus of another format rather than failing on a missing dataset or scoring another
# held-out set.
CORPUS_FORMAT = 3
CORPUS_FORMAT_CHANGE = "its held-out utterances no longer depend on the number of training utterances"
MAX_SECONDS = 5.0

DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_ADJECTIVES = ["red", "blue", "green", "small", "big", "old", "young", "happy", "quiet", "brown"]
_NOUNS = ["cat", "dog", "bird", "fish", "horse", "mouse", "frog", "child", "farmer", "teacher", "baker", "king"]
_VERBS = ["sees", "finds", "likes", "helps", "follows", "carries", "watches", "calls"]
_PLACES = ["in the park", "near the river", "at home", "on the hill", "by the door"]

MDS_COLUMNS = {"audio": "bytes", "text": "str", "voice": "str", "accent": "str", "variant": "str",
               "speed": "int", "pitch": "int", "duration": "float32"}
NUMERALS_COLUMNS = {**MDS_COLUMNS, "number": "str"}
NUMERALS_QUESTION = "What number was said?"  # conf/data/demo.yaml's numerals prompt asks this


@dataclass(frozen=True)
class Utterance:
    dataset: str  # "train/digits_us", "val/sentences_heldout_accent", ...
    text: str
    accent: str
    variant: str
    speed: int
    pitch: int

    @property
    def voice(self) -> str:
        return f"{self.accent}+{self.variant}"


def _noun_phrase(rng: np.random.Generator) -> List[str]:
    words = [str(rng.choice(["the", "a"]))]
    if rng.random() < 0.6:
        words.append(str(rng.choice(_ADJECTIVES)))
    words.append(str(rng.choice(_NOUNS)))
    return words


def sentence(rng: np.random.Generator) -> str:
    words = _noun_phrase(rng) + [str(rng.choice(_VERBS))] + _noun_phrase(rng)
    if rng.random() < 0.3:
        words += str(rng.choice(_PLACES)).split()
    return " ".join(words)


def digit_string(rng: np.random.Generator) -> str:
    return " ".join(DIGIT_WORDS[int(d)] for d in rng.integers(0, 10, size=int(rng.integers(3, 9))))


def numerals(digit_words: str) -> str:
    """"three one four" -> "314"."""
    return "".join(str(DIGIT_WORDS.index(w)) for w in digit_words.split())


def numerals_twin(dataset: str) -> Optional[str]:
    """The numerals dataset written beside a digits dataset of the default corpus, if any
    ("train/digits_us" -> "train/numerals_us")."""
    split, name = dataset.split("/")
    return f"{split}/numerals{name[len('digits'):]}" if name.startswith("digits_") else None


def _voices(accents: List[str], variants: List[str]) -> List[tuple]:
    return [(a, v) for a in accents for v in variants]


def _val_rng(seed: int) -> np.random.Generator:
    """The held-out utterances' own stream: the same held-out set whatever the number of
    training utterances, so runs on corpora of different sizes are scored alike."""
    return np.random.default_rng([seed, 1])


def plan_corpus(num_samples: int, num_val_samples: int, seed: int) -> List[Utterance]:
    """Every utterance of the corpus, in writing order (deterministic in the arguments)."""
    rng = np.random.default_rng(seed)
    items: List[Utterance] = []
    train_voices = [(fam, a, v) for fam, accents in TRAIN_ACCENTS.items() for a in accents for v in TRAIN_VARIANTS]
    # Voices cycle in a shuffled order so every voice gets the same share.
    order = np.concatenate([rng.permutation(len(train_voices)) for _ in range(num_samples // len(train_voices) + 1)])
    for i in range(num_samples):
        fam, accent, variant = train_voices[int(order[i])]
        task = TASKS[i % 2]
        text = digit_string(rng) if task == "digits" else sentence(rng)
        items.append(Utterance(f"train/{task}_{fam}", text, accent, variant,
                               int(rng.integers(140, 191)), int(rng.integers(30, 71))))
    heldout = {
        "heldout_accent": _voices(HELDOUT_ACCENTS, TRAIN_VARIANTS),
        "heldout_variant": _voices([a for accs in TRAIN_ACCENTS.values() for a in accs], HELDOUT_VARIANTS),
    }
    rng = _val_rng(seed)
    for split, voices in heldout.items():
        for task in TASKS:
            for i in range(num_val_samples):
                accent, variant = voices[int(rng.integers(len(voices)))]
                text = digit_string(rng) if task == "digits" else sentence(rng)
                items.append(Utterance(f"val/{task}_{split}", text, accent, variant,
                                       int(rng.integers(140, 191)), int(rng.integers(30, 71))))
    return items


def plan_accent_corpus(accent: str, num_samples: int, num_val_samples: int, seed: int) -> List[Utterance]:
    """Every utterance of a one-accent corpus (dataset names use the accent's name)."""
    rng = np.random.default_rng(seed)
    tag = accent.replace("-", "_")
    items: List[Utterance] = []
    for i in range(num_samples):
        task = TASKS[i % 2]
        text = digit_string(rng) if task == "digits" else sentence(rng)
        items.append(Utterance(f"train/{task}_{tag}", text, accent, TRAIN_VARIANTS[(i // 2) % len(TRAIN_VARIANTS)],
                               int(rng.integers(140, 191)), int(rng.integers(30, 71))))
    rng = _val_rng(seed)
    for task in TASKS:
        for i in range(num_val_samples):
            text = digit_string(rng) if task == "digits" else sentence(rng)
            items.append(Utterance(f"val/{task}_{tag}_heldout", text, accent, HELDOUT_VARIANTS[i % len(HELDOUT_VARIANTS)],
                                   int(rng.integers(140, 191)), int(rng.integers(30, 71))))
    return items


def synthesize(utt: Utterance) -> np.ndarray:
    """espeak-ng -> 16-kHz mono float32 (espeak speaks at 22.05 kHz; resampled here)."""
    import soundfile as sf

    from orchestrator.data.audio import resample

    speed = utt.speed
    for _ in range(4):
        cmd = ["espeak-ng", "-v", utt.voice, "-s", str(speed), "-p", str(utt.pitch), "--stdout", utt.text]
        proc = subprocess.run(cmd, capture_output=True, check=False)
        if proc.returncode != 0 or not proc.stdout:
            raise RuntimeError(f"espeak-ng failed for voice {utt.voice}: {' '.join(cmd)}\n"
                               f"{proc.stderr.decode(errors='replace')}\n(install it: apt-get install -y espeak-ng)")
        samples, rate = sf.read(io.BytesIO(proc.stdout), dtype="float32")
        audio = resample(samples, rate, SAMPLE_RATE)
        if audio.shape[0] <= MAX_SECONDS * SAMPLE_RATE:
            return audio
        speed += 25  # rare: a long sentence at a slow speed; say it faster to stay within the clip limit
    raise RuntimeError(f"could not fit {utt.text!r} ({utt.voice}) into {MAX_SECONDS} s")


def _encode(utt: Utterance) -> Dict:
    from orchestrator.data.audio import encode_flac

    audio = synthesize(utt)
    return {"audio": encode_flac(audio, SAMPLE_RATE), "text": utt.text, "voice": utt.voice, "accent": utt.accent,
            "variant": utt.variant, "speed": utt.speed, "pitch": utt.pitch,
            "duration": float(audio.shape[0] / SAMPLE_RATE)}


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)  # the pool is the parallelism; one thread per process


def tokenizer_texts(utterances: List[Utterance]) -> List[str]:
    """Corpus for the tokenizer: the transcripts and the default prompt's words."""
    from orchestrator.plan.schema.data import DataConfig

    prompt = DataConfig().prompt_template.replace("<SpeechHere>", " ")
    numbers = [numerals(u.text) for u in utterances if u.dataset.split("/")[1].startswith("digits")]
    return ([u.text for u in utterances] + numbers + [prompt, NUMERALS_QUESTION] * 50
            + DIGIT_WORDS + _ADJECTIVES + _NOUNS + _VERBS + _PLACES)


def write_corpus(out_dir: str | Path, num_samples: int = 3000, num_val_samples: int = 100, seed: int = 0,
                 workers: Optional[int] = None, shard_size: str = "4mb", progress: bool = True,
                 vocab_size: int = 512, accent: Optional[str] = None) -> Dict:
    """Synthesize and write the corpus (one accent's with `accent`); returns the manifest
    (also saved as manifest.json)."""
    from streaming import MDSWriter
    from tqdm import tqdm

    from orchestrator.data.tokenizer_build import build_tokenizer

    if shutil.which("espeak-ng") is None:
        raise RuntimeError("espeak-ng is not installed: apt-get install -y espeak-ng (setup.sh installs it)")
    final = Path(out_dir)
    if final.exists() and any(final.iterdir()):
        raise FileExistsError(f"{final} exists and is not empty; choose a new directory or delete it")
    # Written beside the target and renamed into place at the end, so that a write that
    # fails or is interrupted leaves no half corpus for the next run to trip over.
    # One partial directory per writer: two commands started together on a fresh machine
    # both write a corpus, and the first to finish puts its own in place (below).
    out = final.with_name(f".{final.name}.partial-{os.getpid()}")
    _remove_abandoned_partials(final)
    out.mkdir(parents=True)
    utterances = (plan_accent_corpus(accent, num_samples, num_val_samples, seed) if accent
                  else plan_corpus(num_samples, num_val_samples, seed))
    workers = workers or min(2, os.cpu_count() or 1)
    start = time.perf_counter()
    writers: Dict[str, MDSWriter] = {}
    counts: Dict[str, int] = {}
    seconds: Dict[str, float] = {}
    ctx = get_context("spawn")  # no fork of a process that may hold torch threads
    with (ctx.Pool(workers, initializer=_worker_init) if workers > 1 else contextlib.nullcontext()) as pool:
        results = pool.imap(_encode, utterances, chunksize=8) if pool else map(_encode, utterances)
        for utt, sample in tqdm(zip(utterances, results), total=len(utterances), disable=not progress,
                                desc="espeak-ng", unit="utt"):
            twin = None if accent else numerals_twin(utt.dataset)
            rows = [(utt.dataset, MDS_COLUMNS, sample)]
            if twin:
                rows.append((twin, NUMERALS_COLUMNS, {**sample, "number": numerals(utt.text)}))
            for name, columns, row in rows:
                if name not in writers:
                    writers[name] = MDSWriter(out=str(out / name), columns=columns, size_limit=shard_size,
                                              progress_bar=False)
                writers[name].write(row)
                counts[name] = counts.get(name, 0) + 1
                seconds[name] = seconds.get(name, 0.0) + sample["duration"]
    for writer in writers.values():
        writer.finish()
    synth_s = time.perf_counter() - start
    build_tokenizer(tokenizer_texts(utterances), out / "tokenizer", vocab_size=vocab_size)
    manifest = {
        "format": CORPUS_FORMAT, "seed": seed, "num_samples": num_samples, "num_val_samples": num_val_samples, "accent": accent,
        "datasets": {name: {"samples": counts[name], "audio_seconds": round(seconds[name], 2)} for name in counts},
        "train_voices": [f"{a}+{v}" for accs in TRAIN_ACCENTS.values() for a in accs for v in TRAIN_VARIANTS],
        "heldout_accents": HELDOUT_ACCENTS, "heldout_variants": HELDOUT_VARIANTS,
        "synthesis_seconds": round(synth_s, 2), "workers": workers,
        "transcripts": "lower-case words separated by spaces; digits as words (zero ... nine)",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    try:
        if final.exists():
            final.rmdir()  # empty, checked above (not empty: another writer finished first)
        out.rename(final)
    except OSError:
        theirs = final / "manifest.json"
        if not theirs.is_file():
            raise
        shutil.rmtree(out, ignore_errors=True)  # the same corpus (same seed and sizes) is there already
        return json.loads(theirs.read_text())
    return manifest


def _remove_abandoned_partials(final: Path) -> None:
    """Partial directories of writers that no longer run, and this process's own earlier
    one (interrupted writes)."""
    for partial in final.parent.glob(f".{final.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or not _alive(int(pid)):
            shutil.rmtree(partial, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def utterance_dict(utt: Utterance) -> Dict:
    return asdict(utt)
