"""`audiollm data import` / `show`: each format's own corpus -> MDS read back by the training
data path (16 kHz, the known synthetic signal, clip offsets and segments honoured), every
bad record named, an import killed mid-way continued to the same bytes, dry runs."""

import hashlib
import io
import json
import math
import os
import signal
import subprocess
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from orchestrator.data.cli import main
from tests.distributed_run import REPO

RATE = 16000
AMP = 0.5


def sine(seconds: float, rate: int, freq: float, channels: int = 1) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    x = AMP * np.sin(2 * np.pi * freq * t)
    # Stereo: the right channel at half the level, so the mono mix is 0.75 of the left.
    return np.stack([x, 0.5 * x], axis=1) if channels == 2 else x


# name -> (seconds, rate, freq, channels, file format): one clip per resampling case.
CLIPS = {
    "a8k.wav": (1.0, 8000, 300.0, 1, "WAV"),
    "b22k.flac": (1.2, 22050, 440.0, 1, "FLAC"),
    "c44k_stereo.wav": (2.0, 44100, 500.0, 2, "WAV"),
    "d16k.wav": (3.0, 16000, 350.0, 1, "WAV"),
}


def clip_bytes(name: str) -> bytes:
    seconds, rate, freq, channels, fmt = CLIPS[name]
    buf = io.BytesIO()
    sf.write(buf, sine(seconds, rate, freq, channels), rate, format=fmt, subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def audio_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("audio")
    for name in CLIPS:
        (d / name).write_bytes(clip_bytes(name))
    (d / "garbage.wav").write_bytes(b"RIFF not really a wav file at all" * 10)
    return d


def expected(name: str, offset: float = 0.0, duration=None) -> np.ndarray:
    """The clip's mono signal as it should come out at 16 kHz (offsets are whole samples of
    the file's rate, so the cut is exact)."""
    seconds, rate, freq, channels, _ = CLIPS[name]
    n_in = round(((seconds - offset) if duration is None else duration) * rate)
    n_out = math.ceil(n_in * RATE / rate)
    gain = 0.75 if channels == 2 else 1.0
    return gain * AMP * np.sin(2 * np.pi * freq * (offset + np.arange(n_out) / RATE))


def read_back(out: Path):
    """The dataset's samples through the training data path: mosaic mixture of resolved
    entries, each clip decoded as the loader does with data.wrong_sample_rate=refuse (so
    any rate other than 16 kHz fails)."""
    from orchestrator.data import sources
    from orchestrator.data.audio import load_audio
    from orchestrator.plan.schema.data import DatasetEntry

    datasets = sources.resolve_entries([DatasetEntry(name="imported", path=str(out))])
    mixture = sources.open_mixture(datasets, seed=0, shuffle=False,
                                   cache_root=sources.process_cache_root(str(out.parent / "cache")))
    try:
        rows = [mixture[i] for i in range(datasets[0].num_samples)]
    finally:
        sources.close_mixture(mixture)
    for row in rows:
        row["signal"] = load_audio(row["audio"], None, RATE, wrong_rate="refuse")
    return rows


def assert_signal(row, name: str, offset: float = 0.0, duration=None):
    want = expected(name, offset, duration)
    got = row["signal"]
    assert got.shape == want.shape, (row["key"], got.shape, want.shape)
    assert float(row["duration"]) == pytest.approx(want.shape[0] / RATE)
    edge = RATE // 100  # the resampling filter's transients at the clip's cut ends
    np.testing.assert_allclose(got[edge:-edge], want[edge:-edge], atol=2e-3, err_msg=row["key"])


def bad_records(out: Path):
    return [json.loads(line) for line in (out / "bad_records.jsonl").read_text().splitlines()]


def run(*args) -> int:
    return main(["import", *map(str, args), "--no-progress"])


def digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def nemo_lines(audio_dir: Path):
    """Good entries (relative paths, offsets, a stereo clip) and one of each bad kind."""
    return [
        {"audio_filepath": "a8k.wav", "duration": 1.0, "text": "one two"},
        {"audio_filepath": "b22k.flac", "duration": 1.2, "text": " three ", "lang": "en"},
        {"audio_filepath": "c44k_stereo.wav", "offset": 0.5, "duration": 1.0, "text": "four"},
        {"audio_filepath": str(audio_dir / "d16k.wav"), "offset": 1.25, "duration": 0.5, "text": "five"},
        {"audio_filepath": "missing.wav", "duration": 1.0, "text": "six"},
        {"audio_filepath": "a8k.wav", "duration": 1.0, "text": "   "},
        {"audio_filepath": "a8k.wav", "offset": 2.5, "duration": 0.5, "text": "seven"},
        "{this is not json",
        {"audio_filepath": "garbage.wav", "duration": 1.0, "text": "eight"},
        {"audio_filepath": "d16k.wav", "offset": 2.0, "duration": 2.0, "text": "nine"},  # ends 1 s past the file
    ]


def write_manifest(path: Path, lines) -> Path:
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return path


def test_nemo_manifest_imports_with_offsets_and_names_every_bad_line(tmp_path, audio_dir, capsys, tokenizer_dir,
                                                                     encoder_cfg, adapter_cfg):
    from orchestrator.data.loader import build_validation_loaders
    from orchestrator.plan.schema.data import DatasetEntry

    from .conftest import data_config

    manifest = write_manifest(audio_dir / "manifest.json", nemo_lines(audio_dir))
    out = tmp_path / "out"
    assert run("nemo", manifest, out, "--workers", 2, "--chunk-size", 3) == 1
    err = capsys.readouterr().err
    assert "6 of 10 records (60.00 %) are bad, more than --max-bad-fraction 0.01" in err, err
    assert not (out / "index.json").exists() and len(bad_records(out)) == 6  # the report is there to fix by
    # Accepting them completes the import from the parts already written.
    assert run("nemo", manifest, out, "--workers", 2, "--chunk-size", 3, "--max-bad-fraction", 0.6) == 0
    printed = capsys.readouterr().out
    assert "10 records: 4 samples" in printed and "every bad record" in printed
    assert "(4 kept from an earlier run)" in printed
    rows = read_back(out)
    assert [r["text"] for r in rows] == ["one two", "three", "four", "five"]
    assert_signal(rows[0], "a8k.wav")
    assert_signal(rows[1], "b22k.flac")
    assert_signal(rows[2], "c44k_stereo.wav", offset=0.5, duration=1.0)
    assert_signal(rows[3], "d16k.wav", offset=1.25, duration=0.5)
    assert rows[2]["key"] == "c44k_stereo.wav@0.5"
    bad = {b["record"]: b for b in bad_records(out)}
    kinds = {i: b["kind"] for i, b in bad.items()}
    assert kinds == {4: "missing_file", 5: "empty_text", 6: "offset_beyond_file", 7: "bad_entry",
                     8: "unreadable_audio", 9: "offset_beyond_file"}
    assert all(b["where"] == f"{manifest}:{i + 1}" for i, b in bad.items())
    assert "missing.wav does not exist" in bad[4]["reason"]
    assert "offset 2.500 s is at or past the end" in bad[6]["reason"]
    assert "ends 1.000 s past the end" in bad[9]["reason"]
    summary = json.loads((out / "import.json").read_text())
    assert summary["samples"] == 4 and summary["bad_by_kind"]["offset_beyond_file"] == 2
    # The same command again: nothing to do.
    assert run("nemo", manifest, out, "--workers", 2, "--chunk-size", 3, "--max-bad-fraction", 0.6) == 0
    assert "already imported" in capsys.readouterr().out
    assert run("nemo", manifest, out, "--workers", 2, "--chunk-size", 5, "--max-bad-fraction", 0.6) == 1
    assert "other parameters (chunk_size: 3 there, 5 now)" in capsys.readouterr().err

    # The training data config reads it unchanged.
    cfg = data_config(validation=[DatasetEntry(name="mine", path=str(out))], tokenizer=str(tokenizer_dir))
    val = build_validation_loaders(cfg, encoder_cfg, adapter_cfg, micro_batch_size=2)["mine"]
    assert [t for b in val for t in b["transcripts"]] == ["one two", "three", "four", "five"]

    assert main(["show", str(out), "--samples", "2"]) == 0
    shown = capsys.readouterr().out
    assert "4 samples in 2 shards" in shown and "16000 Hz, 1 ch, FLAC PCM_16" in shown
    assert "text: one two" in shown and "6 bad" in shown


def test_kaldi_directory_with_segments_speakers_and_bad_entries(tmp_path, audio_dir, capsys):
    d = tmp_path / "kaldi"
    d.mkdir()
    (d / "wav.scp").write_text(f"recA {audio_dir / 'a8k.wav'}\nrecC {audio_dir / 'c44k_stereo.wav'}\n"
                               f"recD {audio_dir / 'd16k.wav'}\nrecX {audio_dir / 'nothing.wav'}\n")
    (d / "segments").write_text("uA recA 0 -1\n"
                                "uC recC 0.25 1.75\n"
                                "uD1 recD 0.5 1.0\n"
                                "uD2 recD 2.5 -1\n"
                                "uZ recZ 0 1\n"          # no such recording
                                "uX recX 0 1\n"          # its file is missing
                                "uE recD 1.0\n"          # malformed
                                "uN recD 1.0 2.0\n")     # no transcript
    (d / "text").write_text("uA one\nuC two three\nuD1 four\nuD2 five\nuZ six\nuX seven\nuE eight\n"
                            "uOrphan nine\n")
    (d / "utt2spk").write_text("uA s1\nuC s2\nuD1 s3\nuD2 s3\nuX s4\n")
    out = tmp_path / "out"
    assert run("kaldi", d, out, "--workers", 1, "--keep-field", "speaker", "--max-bad-fraction", 1) == 0
    rows = read_back(out)
    assert [(r["key"], r["text"], r["speaker"]) for r in rows] == [
        ("uA", "one", "s1"), ("uC", "two three", "s2"), ("uD1", "four", "s3"), ("uD2", "five", "s3")]
    assert_signal(rows[0], "a8k.wav")
    assert_signal(rows[1], "c44k_stereo.wav", offset=0.25, duration=1.5)
    assert_signal(rows[2], "d16k.wav", offset=0.5, duration=0.5)
    assert_signal(rows[3], "d16k.wav", offset=2.5)
    bad = {b["key"]: (b["kind"], b["where"]) for b in bad_records(out)}
    assert bad == {"uZ": ("no_audio", f"{d}/segments:5"), "uX": ("missing_file", f"{d}/segments:6"),
                   "uE": ("bad_entry", f"{d}/segments:7"), "uN": ("empty_text", f"{d}/segments:8"),
                   "uOrphan": ("no_audio", f"{d}/text:8")}
    # A piped wav.scp entry refuses the import, naming its line; nothing is written.
    (d / "wav.scp").write_text(f"recA {audio_dir / 'a8k.wav'}\nrecB sox b.sph -t wav - |\n")
    assert run("kaldi", d, tmp_path / "piped", "--workers", 1) == 1
    err = capsys.readouterr().err
    assert f"{d}/wav.scp:2: recording recB is a command ('sox b.sph -t wav - |')" in err and "wav-copy" in err
    assert not (tmp_path / "piped").exists()


def test_hf_save_to_disk_dataset_dict(tmp_path, audio_dir, capsys):
    datasets = pytest.importorskip("datasets")

    rows = [
        ({"bytes": clip_bytes("b22k.flac"), "path": None}, "alpha", 1),
        ({"bytes": None, "path": str(audio_dir / "c44k_stereo.wav")}, "beta", 2),  # stored as a path only
        ({"bytes": b"not audio at all", "path": None}, "gamma", 3),
        ({"bytes": clip_bytes("a8k.wav"), "path": None}, "", 4),
        ({"bytes": clip_bytes("a8k.wav"), "path": None}, "delta", 5),
    ]

    def split(items):
        ds = datasets.Dataset.from_dict({"audio": [r[0] for r in items], "sentence": [r[1] for r in items],
                                         "speaker_id": [r[2] for r in items]})
        # The Audio feature as datasets stores it (bytes or path); encoding through it
        # would need torchcodec, the cast does not.
        return ds.cast_column("audio", datasets.Audio())

    src = tmp_path / "hf"
    datasets.DatasetDict({"train": split(rows), "test": split(rows[:1])}).save_to_disk(str(src))
    out = tmp_path / "out"
    assert run("hf", src, out, "--workers", 2, "--max-bad-fraction", 1) == 1
    assert "holds splits train, test: choose one with --split" in capsys.readouterr().err
    assert run("hf", src, out, "--split", "train", "--workers", 2, "--max-bad-fraction", 1) == 1
    assert "has no column 'text' (--text-field)" in capsys.readouterr().err
    assert run("hf", src, out, "--split", "train", "--text-field", "sentence", "--keep-field", "speaker_id",
               "--workers", 2, "--max-bad-fraction", 1) == 0
    got = read_back(out)
    assert [(r["key"], r["text"], r["speaker_id"]) for r in got] == [
        ("train/0", "alpha", "1"), ("train/1", "beta", "2"), ("train/4", "delta", "5")]
    assert_signal(got[0], "b22k.flac")
    assert_signal(got[1], "c44k_stereo.wav")
    assert_signal(got[2], "a8k.wav")
    bad = {b["record"]: b for b in bad_records(out)}
    assert {i: b["kind"] for i, b in bad.items()} == {2: "unreadable_audio", 3: "empty_text"}
    assert bad[2]["where"] == f"{src}[train]:2"


def test_webdataset_shards_plain_and_compressed(tmp_path, capsys):
    wds = pytest.importorskip("webdataset")

    shards = tmp_path / "shards"
    shards.mkdir()
    with wds.TarWriter(str(shards / "part-000.tar")) as w:
        w.write({"__key__": "s/0001", "flac": clip_bytes("b22k.flac"), "txt": "hello there"})
        w.write({"__key__": "s/0002", "wav": clip_bytes("c44k_stereo.wav"), "json": {"text": "stereo", "spk": 7}})
        w.write({"__key__": "s/0003", "txt": "no audio here"})
        w.write({"__key__": "s/0004", "wav": clip_bytes("a8k.wav"), "flac": clip_bytes("b22k.flac"), "txt": "two"})
    with wds.TarWriter(str(shards / "part-001.tar.gz"), compress=True) as w:
        w.write({"__key__": "s/0005", "wav": clip_bytes("a8k.wav"), "txt": "compressed"})
        w.write({"__key__": "s/0006", "wav": clip_bytes("a8k.wav"), "json": b"{broken"})
    out = tmp_path / "out"
    assert run("wds", shards, out, "--workers", 1, "--max-bad-fraction", 1, "--audio-format", "wav") == 0
    got = read_back(out)
    assert [(r["key"], r["text"]) for r in got] == [("s/0001", "hello there"), ("s/0002", "stereo"),
                                                   ("s/0005", "compressed")]
    assert got[0]["audio"][:4] == b"RIFF"  # --audio-format wav
    assert_signal(got[0], "b22k.flac")
    assert_signal(got[1], "c44k_stereo.wav")
    assert_signal(got[2], "a8k.wav")
    bad = {b["key"]: b for b in bad_records(out)}
    assert {k: b["kind"] for k, b in bad.items()} == {"s/0003": "no_audio", "s/0004": "no_audio",
                                                      "s/0006": "bad_entry"}
    assert bad["s/0004"]["where"] == f"{shards / 'part-000.tar'}:s/0004"
    assert "choose one with --audio-field" in bad["s/0004"]["reason"]
    # The json's keys are fields: the speaker kept from the one sample that has it is named missing elsewhere.
    assert run("wds", shards / "part-000.tar", tmp_path / "spk", "--keep-field", "spk", "--workers", 1,
               "--max-bad-fraction", 1) == 0
    assert [(r["key"], r["spk"]) for r in read_back(tmp_path / "spk")] == [("s/0002", "7")]


def test_killed_import_continues_to_the_same_bytes_and_dry_run_writes_nothing(tmp_path, audio_dir, capsys):
    """An import killed (SIGKILL, workers and all) in the middle of its second part
    continues, with another worker count, to the bytes of an uninterrupted import. The
    killed run meets a named pipe where the second part's third clip is, and waits there:
    part 0 written, part 1 begun, at a known point."""
    names = ["a8k.wav", "b22k.flac", "c44k_stereo.wav", "d16k.wav"]
    lines = [{"audio_filepath": str(audio_dir / names[i % 4]), "duration": 0.4, "offset": 0.1 * (i % 3),
              "text": f"utt {i}"} for i in range(10)]
    lines[6] = {"audio_filepath": "pipe.wav", "duration": 0.4, "text": "through a pipe"}
    lines[8] = {"audio_filepath": "missing.wav", "duration": 1.0, "text": "gone"}
    manifest = write_manifest(tmp_path / "resume.json", lines)
    pipe = tmp_path / "pipe.wav"
    pipe.write_bytes(clip_bytes("a8k.wav"))
    args = ["--chunk-size", 4, "--shard-size", "10kb", "--max-bad-fraction", 0.2]

    # Dry run: counts and hours from the headers, nothing written.
    assert run("nemo", manifest, tmp_path / "dry", "--dry-run", *args) == 0
    printed = capsys.readouterr().out
    assert "10 records: 9 samples (0.001 h of audio" in printed and "would write 3 chunks" in printed
    assert not (tmp_path / "dry").exists()

    whole = tmp_path / "whole"
    assert run("nemo", manifest, whole, "--workers", 1, *args) == 0
    capsys.readouterr()
    assert len(json.loads((whole / "index.json").read_text())["shards"]) > 3  # several shards per part

    pipe.unlink()
    os.mkfifo(pipe)
    killed = tmp_path / "killed"
    parts = killed / ".import" / "parts"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.data.cli", "import", "nemo", str(manifest),
                             str(killed), "--workers", "2", "--no-progress", *map(str, args)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not ((parts / "000000" / "chunk.json").exists() and (parts / "000001.partial").exists()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the import and its workers
        proc.wait(timeout=30)
    assert not (killed / "index.json").exists()
    pipe.unlink()
    pipe.write_bytes(clip_bytes("a8k.wav"))

    # A dry run on the interrupted import tells what is there and changes nothing.
    before = digest(killed)
    assert run("nemo", manifest, killed, "--dry-run", *args) == 0
    assert "(1 already written)" in capsys.readouterr().out and digest(killed) == before

    assert run("nemo", manifest, killed, "--workers", 1, *args) == 0
    assert "(1 kept from an earlier run)" in capsys.readouterr().out
    # The same dataset, byte for byte (what the import read differs: pipe.wav was rewritten since)
    assert {k: v for k, v in digest(killed).items() if k != "import_source.json"} == \
        {k: v for k, v in digest(whole).items() if k != "import_source.json"}
    assert not (killed / ".import").exists()

    assert main(["show", str(tmp_path), "--samples", "0"]) == 0
    assert "2 datasets: 18 samples" in capsys.readouterr().out


def test_show_reads_any_mds_dataset(tmp_path, capsys):
    """A dataset the import did not write (no import.json, no duration column): hours from
    every clip's audio header."""
    from .conftest import tone_samples, write_mds

    samples = tone_samples(5, seed=2)
    write_mds(tmp_path / "corpus" / "a", samples)
    write_mds(tmp_path / "corpus" / "b", samples[:2])
    assert main(["show", str(tmp_path / "corpus"), "--samples", "1"]) == 0
    shown = capsys.readouterr().out
    seconds = [sf.info(io.BytesIO(s["audio"])).duration for s in samples]
    assert "corpus/a: 5 samples in" in shown
    assert f"{sum(seconds) / 3600:.3f} h of audio, clips {min(seconds):.2f}-{max(seconds):.2f} s" in shown
    assert f"text: {samples[0]['text']}" in shown and "2 datasets: 7 samples" in shown
    assert main(["show", str(tmp_path / "nothing")]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_numpy_resampler_is_the_training_resampler():
    from orchestrator.data.audio import resample as torch_resample
    from orchestrator.hf_model.resample_audiollm import resample

    x = np.random.default_rng(0).standard_normal(30000).astype(np.float32) * 0.3
    for rate in (8000, 22050, 44100, 48000):
        a, b = torch_resample(x, rate, RATE), resample(x, rate, RATE)
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-5


def test_kaldi_relative_paths_not_found_from_here_are_refused_naming_audio_root(tmp_path, audio_dir, monkeypatch,
                                                                                capsys):
    """A Kaldi recipe's wav.scp names paths relative to the recipe directory its tools ran
    in: from elsewhere, without --audio-root, the import says where they are found."""
    recipe = tmp_path / "recipe"
    d = recipe / "data" / "train"
    d.mkdir(parents=True)
    (recipe / "wav").mkdir()
    shutil.copy(audio_dir / "d16k.wav", recipe / "wav" / "r1.wav")
    (d / "wav.scp").write_text("r1 wav/r1.wav\n")
    (d / "text").write_text("r1 hello\n")
    monkeypatch.chdir(tmp_path)
    assert run("kaldi", d, tmp_path / "out", "--workers", 1) == 1
    err = capsys.readouterr().err
    assert f"{d}/wav.scp:1: recording r1's path wav/r1.wav is relative and not found from the current directory " \
           f"{tmp_path}" in err and "pass --audio-root DIR" in err and f"it is found from {recipe}" in err, err
    assert run("kaldi", d, tmp_path / "out", "--workers", 1, "--audio-root", recipe) == 0
    assert [r["text"] for r in read_back(tmp_path / "out")] == ["hello"]
    monkeypatch.chdir(recipe)  # as Kaldi's tools read it
    assert run("kaldi", d, tmp_path / "out2", "--workers", 1) == 0


def test_a_finished_import_whose_source_changed_is_not_already_imported(tmp_path, audio_dir, capsys):
    """An edited manifest after the import finished: the dataset no longer holds what the
    source does, and the same command says so instead of "nothing to do"."""
    manifest = write_manifest(tmp_path / "manifest.json", nemo_lines(audio_dir))
    args = ("--workers", 1, "--chunk-size", 3, "--max-bad-fraction", 0.6, "--audio-root", audio_dir)
    assert run("nemo", manifest, tmp_path / "out", *args) == 0
    capsys.readouterr()
    lines = manifest.read_text().splitlines()
    manifest.write_text("\n".join([lines[0].replace("one two", "one too"), *lines[1:]]) + "\n")
    assert run("nemo", manifest, tmp_path / "out", *args) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'out'} holds a finished import of {manifest} as it was then; the source has changed since " \
           f"(records 0-2: 1 of 4 chunks of 3)" in err and f"delete {tmp_path / 'out'}" in err, err
