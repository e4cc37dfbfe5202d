"""A corpus in each format `audiollm data import` reads, written by that format's own
tools, imported, trained on and evaluated through the commands a user types: NeMo
manifest, Kaldi directory, WebDataset tar and HF `save_to_disk`, one training mixture of
the four. (tests/data/test_import.py checks each format's reading in detail.)"""

import json
import re
from pathlib import Path

import pytest

from orchestrator.data.cli import main as data_main
from tests.data.conftest import tone_samples
from tests.train.audiollm_runs import audiollm_cli

FORMATS = ("nemo", "kaldi", "wds", "hf")


def write_sources(root: Path, samples: list) -> dict:
    """The same utterances (16-kHz FLAC bytes and their words) in each format."""
    import datasets
    import webdataset

    audio = root / "audio"
    audio.mkdir(parents=True)
    for i, s in enumerate(samples):
        (audio / f"utt{i:02d}.flac").write_bytes(s["audio"])
    nemo = root / "manifest.json"
    nemo.write_text("".join(json.dumps({"audio_filepath": f"audio/utt{i:02d}.flac", "text": s["text"]}) + "\n"
                            for i, s in enumerate(samples)))
    kaldi = root / "kaldi"
    kaldi.mkdir()
    (kaldi / "wav.scp").write_text("".join(f"utt{i:02d} {audio / f'utt{i:02d}.flac'}\n" for i in range(len(samples))))
    (kaldi / "text").write_text("".join(f"utt{i:02d} {s['text']}\n" for i, s in enumerate(samples)))
    wds = root / "shard-000000.tar"
    with webdataset.TarWriter(str(wds)) as sink:
        for i, s in enumerate(samples):
            sink.write({"__key__": f"utt{i:02d}", "flac": s["audio"], "txt": s["text"]})
    hf = root / "hf"
    table = datasets.Dataset.from_dict({"audio": [{"bytes": s["audio"], "path": None} for s in samples],
                                        "text": [s["text"] for s in samples]})
    table.cast_column("audio", datasets.Audio()).save_to_disk(str(hf))
    return {"nemo": nemo, "kaldi": kaldi, "wds": wds, "hf": hf}


@pytest.mark.multiprocess
def test_a_corpus_in_each_format_is_imported_trained_on_and_evaluated(tmp_path, tokenizer_dir):
    sources = write_sources(tmp_path / "sources", tone_samples(12, seed=5))
    imported = tmp_path / "mds"
    for fmt in FORMATS:
        assert data_main(["import", fmt, str(sources[fmt]), str(imported / fmt), "--workers", "1",
                          "--no-progress"]) == 0, fmt
    train = ",".join(f"{{name:{fmt},path:'{imported / fmt}'}}" for fmt in FORMATS)
    proc = audiollm_cli([
        "train", "+recipe=tiny_cpu", "data.demo_corpus=null", f"data.tokenizer='{tokenizer_dir}'",
        f"data.train=[{train}]", f"data.validation=[{{name:nemo_val,path:'{imported / 'nemo'}'}}]",
        "optim.micro_batch_size=2", "optim.global_batch_size=4", "optim.lr_warmup_iters=1", "data.seq_length=128",
        "data.packing_buffer=8", "data.feature_cache_mb=64", "model.adapter.dropout=0.0", "train.iters=4",
        "train.save_interval=4", "train.eval_interval=0", "train.eval_iters=1", "logger=none",
        f"run.output_root={tmp_path / 'runs'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:]
    run_dir = Path(re.search(r"^starting run (\S+)", proc.stdout, re.M).group(1))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["loss"] == r["loss"] for r in rows)
    trained_on = {fmt for r in rows for fmt in FORMATS if f"loss/{fmt}" in r}
    assert trained_on == set(FORMATS), rows  # every imported dataset fed the training
    proc = audiollm_cli(["eval", str(run_dir)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:]
    scored = json.loads((run_dir / "eval" / "step_000004.json").read_text())
    assert scored["wer/utterances"] == 12 and scored["val_loss/nemo_val"] > 0
