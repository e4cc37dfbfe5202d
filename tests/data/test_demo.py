"""The espeak-ng demo corpus: real speech, several MDS datasets, held-out voices, deterministic."""

import hashlib
import json
import os
import shutil

import pytest

from orchestrator.data import demo
from orchestrator.data.cli import main

# Only what synthesizes speech needs the binary; planning the corpus is pure Python.
needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                  reason="espeak-ng is not installed (apt-get install -y espeak-ng)")


def _digest(root):
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json"):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def test_plan_holds_out_accents_and_variants():
    items = demo.plan_corpus(480, 20, seed=0)
    train = [u for u in items if u.dataset.startswith("train/")]
    val = [u for u in items if u.dataset.startswith("val/")]
    train_voices = {u.voice for u in train}
    assert len(train_voices) == 48
    assert not train_voices & {u.voice for u in val}
    assert {u.accent for u in val if "heldout_accent" in u.dataset} == set(demo.HELDOUT_ACCENTS)
    assert not {u.accent for u in train} & set(demo.HELDOUT_ACCENTS)
    assert not {u.variant for u in train} & set(demo.HELDOUT_VARIANTS)
    assert {u.dataset for u in train} == {"train/digits_us", "train/digits_gb", "train/sentences_us",
                                          "train/sentences_gb"}
    assert all(3 <= len(u.text.split()) <= 8 for u in train if "digits" in u.dataset)
    assert demo.plan_corpus(480, 20, seed=0) == items and demo.plan_corpus(480, 20, seed=1) != items
    # The held-out set does not depend on the number of training utterances.
    assert [u for u in demo.plan_corpus(960, 20, seed=0) if u.dataset.startswith("val/")] == val


def test_accent_corpus_trains_and_validates_one_accent_on_disjoint_variants():
    items = demo.plan_accent_corpus("nl", 40, 6, seed=1)
    datasets = {u.dataset for u in items}
    assert datasets == {"train/digits_nl", "train/sentences_nl", "val/digits_nl_heldout", "val/sentences_nl_heldout"}
    assert {u.accent for u in items} == {"nl"}
    train = {u.variant for u in items if u.dataset.startswith("train/")}
    val = {u.variant for u in items if u.dataset.startswith("val/")}
    assert train == set(demo.TRAIN_VARIANTS) and val == set(demo.HELDOUT_VARIANTS)
    assert sum(u.dataset.startswith("val/") for u in items) == 12
    assert items == demo.plan_accent_corpus("nl", 40, 6, seed=1)  # a pure function of its arguments
    assert ([u for u in demo.plan_accent_corpus("nl", 80, 6, seed=1) if u.dataset.startswith("val/")]
            == [u for u in items if u.dataset.startswith("val/")])


@needs_espeak
def test_cli_writes_mds_datasets_and_tokenizer_deterministically(tmp_path, encoder_cfg, adapter_cfg):
    from streaming import StreamingDataset

    from orchestrator.data.audio import decode_bytes
    from orchestrator.data.loader import build_train_loader, build_validation_loaders
    from orchestrator.data.sources import single_rank_world
    from orchestrator.plan.schema.data import DatasetEntry

    from .conftest import data_config

    assert main(["demo", str(tmp_path / "a"), "--num-samples", "8", "--num-val-samples", "1", "--seed", "3",
                 "--workers", "1", "--no-progress"]) == 0
    # Same corpus from two worker processes.
    assert main(["demo", str(tmp_path / "b"), "--num-samples", "8", "--num-val-samples", "1", "--seed", "3",
                 "--workers", "2", "--no-progress"]) == 0
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert main(["demo", str(tmp_path / "a"), "--num-samples", "8"]) == 1  # refuses a non-empty directory
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    twins = {name for name in manifest["datasets"] if "numerals" in name}
    assert twins and all(demo.numerals_twin(name.replace("numerals", "digits")) == name for name in twins)
    # Each digits utterance is written twice: as words, and with its numerals twin's number column.
    digits = sum(d["samples"] for name, d in manifest["datasets"].items() if "digits" in name)
    assert sum(d["samples"] for name, d in manifest["datasets"].items() if name in twins) == digits
    assert sum(d["samples"] for name, d in manifest["datasets"].items() if name not in twins) == 8 + 4
    with single_rank_world():
        ds = StreamingDataset(local=str(tmp_path / "a" / "train" / "digits_gb"), shuffle=False)
    sample = ds[0]
    audio, rate = decode_bytes(sample["audio"])
    assert rate == 16000 and 0.5 < audio.shape[0] / rate <= 5.0 and abs(audio).max() > 0.05
    assert set(sample["text"].split()) <= set(demo.DIGIT_WORDS)
    # The demo corpus feeds the loader as is.
    root = tmp_path / "a"
    cfg = data_config([DatasetEntry(name="demo", path=str(root / "train" / "*"))],
                      validation=[DatasetEntry(name="acc", path=str(root / "val" / "digits_heldout_accent"))],
                      tokenizer=str(root / "tokenizer"))
    batch = next(build_train_loader(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2, seed=0))
    assert batch["num_samples"] >= 2 and batch["audio_features"].shape[1:] == (80, 500)
    val = build_validation_loaders(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2)["acc"]
    assert [t for b in val for t in b["transcripts"]][0].split()[0] in demo.DIGIT_WORDS


@needs_espeak
def test_a_failed_write_leaves_no_half_corpus_and_the_next_one_starts_clean(tmp_path, monkeypatch):
    from orchestrator.data import tokenizer_build

    def interrupted(*args, **kwargs):
        raise RuntimeError("interrupted after the shards were written")

    target = tmp_path / "corpus"
    monkeypatch.setattr(tokenizer_build, "build_tokenizer", interrupted)
    with pytest.raises(RuntimeError, match="interrupted"):
        demo.write_corpus(target, num_samples=4, num_val_samples=1, workers=1, progress=False)
    assert not target.exists()  # a next `audiollm train` writes the corpus again instead of refusing the directory
    monkeypatch.undo()
    manifest = demo.write_corpus(target, num_samples=4, num_val_samples=1, workers=1, progress=False)
    assert json.loads((target / "manifest.json").read_text())["datasets"] == manifest["datasets"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # nothing partial left beside it


@needs_espeak
def test_two_writers_of_one_corpus_both_end_with_the_first_finished_corpus(tmp_path, monkeypatch):
    """Two commands on a fresh machine both synthesize the demo corpus into one directory:
    each writes its own partial directory, the first to finish puts it in place, and the
    other (here: this process, whose tokenizer step waits for a second writer that runs
    to completion) adopts it instead of failing at the rename."""
    import subprocess
    import sys

    from orchestrator.data import tokenizer_build
    from tests.distributed_run import REPO

    target = tmp_path / "corpus"
    real_build = tokenizer_build.build_tokenizer

    def meanwhile_another_writer_finishes(*args, **kwargs):
        subprocess.run([sys.executable, "-m", "orchestrator.data.cli", "demo", str(target), "--num-samples", "4",
                        "--num-val-samples", "1", "--workers", "1", "--no-progress"], check=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, timeout=300)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(tokenizer_build, "build_tokenizer", meanwhile_another_writer_finishes)
    manifest = demo.write_corpus(target, num_samples=4, num_val_samples=1, workers=1, progress=False)
    theirs = json.loads((target / "manifest.json").read_text())
    assert manifest == theirs  # the corpus in place, not this writer's (its partial removed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
