"""The AudioLLM as one HF model directory (`audiollm convert megatron-to-hf`'s default for
a run): trained at TP1, TP2 with sequence parallelism and PP2 (a Llama decoder), exported, and loaded with
AutoModelForCausalLM / AutoProcessor (trust_remote_code) in virtual environments that
hold torch and transformers but not this project, at transformers 4.x and 5.x: greedy
answers to the held-out clips equal `audiollm eval`'s. The directory converts back
(hf-to-megatron, --verify) to the same weights, and its processor builds the data side's
prompt and features."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from orchestrator.hf_model.longform_audiollm import merge, windows
from orchestrator.plan.decoder_families import prompt_overrides
from tests.train.audiollm_runs import LLAMA_DECODER, VAL_SET, audiollm_cli, make_corpus, write_audiollm_run_dir
from tests.data.conftest import WORDS
from tests.data.family_tokenizers import build_family_tokenizer
from tests.train.jobs import launch

HERE = Path(__file__).parent
REPO = HERE.parent.parent
ITERS = 12
# name -> (tp, pp, overrides): the CTC loss needs pp 1 (orchestrator/plan/rules/run.check_ctc). The export of
# each family beside Gemma2: a Llama decoder at PP2 (untied output layer, Llama 3's RoPE
# scaling); a Qwen3 one at TP2+SP (QK-norm) with a tokenizer of Qwen's layout and Qwen's
# prompt (no BOS); a Gemma 3 one of 6 layers (one global, its local RoPE base, linear
# scaling).
NO_GEMMA2_KEYS = ["model.decoder.sliding_window=null", "model.decoder.query_pre_attn_scalar=null",
                  "model.decoder.attn_logit_softcap=null", "model.decoder.final_logit_softcap=null"]
LAYOUTS = {"tp1": (1, 1, []), "tp2_sp": (2, 1, ["parallel.sp=true"]),
           "pp2_llama": (1, 2, ["data.packing=true", "model.adapter.ctc_weight=0", *LLAMA_DECODER]),
           "tp2_sp_qwen3": (2, 1, ["parallel.sp=true", "model.decoder.family=qwen3", *NO_GEMMA2_KEYS,
                                   "model.decoder.rope_theta=1000000", *prompt_overrides("qwen3")]),
           "tp1_gemma3": (1, 1, ["model.decoder.family=gemma3", "model.decoder.attn_logit_softcap=null",
                                 "model.decoder.final_logit_softcap=null", "model.decoder.num_layers=6",
                                 "model.decoder.rope_local_theta=10000", "model.decoder.rope_scaling_factor=8"])}
# The tokenizer of a layout's family where it is not make_corpus's (Gemma's layout).
TOKENIZERS = {"tp2_sp_qwen3": "qwen3"}
# transformers releases before a family's model cannot build its decoder
# (configuration_audiollm.DECODER_SINCE): the oldest 4.x tested has neither of these.
NEWER_THAN_4X = {"tp2_sp_qwen3": "4.51", "tp1_gemma3": "4.50"}
# transformers 4.x's oldest release the remote code claims (4.46), beside torch and numpy
# at this project's pins (in the installer's cache already); 5.x: the lent GPU machine's
# stack (constraints-gpu-machine.txt), the environment tests/rehearsal/lent_machine.py makes.
OLDEST_4X = "transformers==4.46.3"
PEFT_FOR_4X = "peft==0.13.2"  # the --lora peft export's adapter (tests/train/test_init_checkpoint.py)
LOGIT_BOUND = 1e-4


def _pin(name: str, constraints: Path = REPO / "constraints.txt") -> str:
    line = next(line for line in constraints.read_text().splitlines() if line.startswith(name + "=="))
    return line.strip()


def env_4x() -> Path:
    from tests.venvs import cached_venv

    interpreter = getattr(sys, "_base_executable", sys.executable)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return cached_venv("hf-only", interpreter, version, [_pin("torch"), OLDEST_4X, _pin("numpy"), PEFT_FOR_4X])


def env_5x() -> Path:
    from tests.rehearsal.lent_machine import make_machine

    return make_machine()[0]


# The newest release on the registry when this was written: 5.24 renamed the KV cache's
# argument of generation (past_key_values -> cache), which the remote code follows.
NEWEST = "transformers==5.25.0"


def env_newest() -> Path:
    from tests.venvs import cached_venv

    interpreter = getattr(sys, "_base_executable", sys.executable)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return cached_venv("hf-newest", interpreter, version, [_pin("torch"), NEWEST, _pin("numpy")])


def write_held_out_clips(dataset: Path, out: Path) -> Path:
    """An MDS dataset's clips as 16-kHz arrays in one .npz (clip_0, clip_1, ...); and a
    recording over two of the tiny encoder's 5-s windows (the clips joined with 0.3 s of
    quiet between them) with the windows the project cuts it into, and the first clip at
    44.1 kHz (hf_model_script.py)."""
    from streaming import LocalDataset

    from orchestrator.data.audio import load_audio, resample
    from orchestrator.hf_model.longform_audiollm import windows

    held_out = LocalDataset(local=str(dataset))
    clips = [load_audio(held_out[i]["audio"], None, 16000) for i in range(len(held_out))]
    pause, joined = np.zeros(int(0.3 * 16000), np.float32), []
    while sum(map(len, joined)) <= 2 * 5 * 16000:  # over two windows: three or more, cut twice
        joined += [clips[len(joined) // 2 % len(clips)], pause]
    long = np.concatenate(joined)
    np.savez(out, **{f"clip_{i}": clip for i, clip in enumerate(clips)}, long=long,
             long_windows=np.asarray(windows(long, 5 * 16000)), first_at_44k=resample(clips[0], 16000, 44100))
    return out


def answers_without_the_project(python3: Path, clips: Path, exports: list, out: Path, *flags: str) -> dict:
    """tests/convert/hf_model_script.py's answers and logits, run by `python3` (an
    environment without this project) from a folder outside the checkout."""
    proc = subprocess.run([str(python3), str(HERE / "hf_model_script.py"), str(clips), str(out), *map(str, exports),
                           *flags], capture_output=True, text=True, timeout=600, cwd=out.parent,
                          env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Each layout's run: trained ITERS steps, scored by `audiollm eval --ctc-weight 0`
    (greedy, every answer kept) and exported; plus the held-out clips as 16-kHz arrays."""
    root = tmp_path_factory.mktemp("hf_model")
    corpus = make_corpus(root / "corpus")
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5 + ["user assistant Transcribe:"] * 5
    for family in set(TOKENIZERS.values()):
        build_family_tokenizer(family, texts, corpus / f"tokenizer_{family}")
    runs = {}
    for name, (tp, pp, extra) in LAYOUTS.items():
        if name in TOKENIZERS:
            extra = [*extra, f"data.tokenizer={corpus / f'tokenizer_{TOKENIZERS[name]}'}"]
        run_dir = write_audiollm_run_dir(root / name, corpus, tp=tp, pp=pp, iters=ITERS, extra=extra)
        launch("job_script.py", tp * pp, "train", str(run_dir), log_dir=root)
        scored = audiollm_cli(["eval", str(run_dir), "--ctc-weight", "0", "--examples", "100"], cwd=REPO)
        assert scored.returncode == 0, scored.stdout[-4000:]
        export = root / f"{name}_hf"
        out = audiollm_cli(["convert", "megatron-to-hf", "--megatron", str(run_dir), "--out", str(export)], cwd=REPO)
        assert out.returncode == 0 and "one AudioLLM model directory with its processor" in out.stdout, out.stdout
        report = json.loads((run_dir / "eval" / f"step_{ITERS:06d}.json").read_text())
        runs[name] = {"run": run_dir, "export": export, "answers": [hyp for _, hyp in report["examples"][VAL_SET]]}
    clips = write_held_out_clips(corpus / "val" / VAL_SET, root / "clips.npz")
    for name, run in runs.items():  # the project's own model's logits of each prompt
        run["logits"] = root / f"{name}_logits.npy"
        proc = subprocess.run([sys.executable, str(HERE / "project_logits_script.py"), str(run["run"]),
                               str(root / "clips.npz"), str(run["logits"])], capture_output=True, text=True,
                              timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    count = len([name for name in np.load(clips).files if name.startswith("clip_")])
    return {"root": root, "runs": runs, "clips": clips, "count": count}


def test_the_model_card_names_the_releases_tested_here():
    """The card's "tested with" is this file's environments: the oldest 4.x, the lent
    GPU machine's 5.x and the newest."""
    from orchestrator.convert.audiollm_dir import REMOTE_CODE_SINCE, TESTED_TRANSFORMERS

    gpu_machine = _pin("transformers", REPO / "constraints-gpu-machine.txt")
    assert TESTED_TRANSFORMERS == tuple(pin.split("==")[1] for pin in (OLDEST_4X, gpu_machine, NEWEST))
    assert OLDEST_4X.split("==")[1].startswith(REMOTE_CODE_SINCE + ".")


@pytest.mark.multiprocess
@pytest.mark.parametrize("make_env,major", [(env_4x, "4"), (env_5x, "5"), (env_newest, "5")],
                         ids=["transformers4", "transformers5", "transformers_newest"])
def test_exports_answer_the_held_out_clips_as_audiollm_eval_without_the_project(exported, make_env, major, tmp_path):
    runs = {name: run for name, run in exported["runs"].items() if major != "4" or name not in NEWER_THAN_4X}
    answers = answers_without_the_project(make_env(), exported["clips"], [r["export"] for r in runs.values()],
                                          tmp_path / "answers.json", "--batch", "3")
    assert answers["transformers"].split(".")[0] == major, answers["transformers"]
    for name, run in runs.items():
        got = answers["exports"][str(run["export"])]
        # Batches of 3 left-padded prompts: the answers do not depend on the batch.
        assert len(run["answers"]) == exported["count"] and any(run["answers"]), (name, run["answers"])
        assert [t.strip() for t in got["texts"]] == [a.strip() for a in run["answers"]], (name, answers["transformers"])
        # A few steps on tones leave every answer alike: the logits show the audio's path.
        # fp32 against the project's model: the bound --verify holds conversions to; the
        # clips' logits differ by a hundred times more, so audio that went astray (unscaled,
        # misplaced, another clip's) cannot pass.
        ours = np.load(run["logits"])
        theirs = np.asarray(got["logits"])[:, :ours.shape[1]]
        assert np.abs(theirs - ours).max() <= LOGIT_BOUND, (name, float(np.abs(theirs - ours).max()))
        assert np.abs(ours - ours[:1]).max() > 100 * LOGIT_BOUND, name
        # pipeline(model=DIR, trust_remote_code=True): the task inferred, the same answer
        assert got["pipeline"] == {"task": "automatic-speech-recognition", "text": got["texts"][0].strip()}, name
        # a recording longer than the window: cut as `audiollm transcribe` cuts it, the answers
        # joined as it joins them; a clip at 44.1 kHz resampled without torchaudio
        assert len(got["long_windows"]) >= 3 and got["pipeline_long"] == merge(
            [a.strip() for a in got["long_windows"] if a.strip()]), name
        assert got["pipeline_44k"] == got["texts"][0].strip(), name
        print(f"{name} on transformers {answers['transformers']}: {got['texts'][:2]}")


@pytest.mark.parametrize("layout", ["tp2_sp", "tp2_sp_qwen3", "tp1_gemma3"])
def test_the_export_converts_back_to_the_same_weights_and_verifies(exported, tmp_path, layout):
    """model directory -> hf-to-megatron --verify -> the decoder, encoder and adapter
    tensors bit for bit those of the run's own export as parts, for each family's decoder."""
    from safetensors.torch import load_file

    run = exported["runs"][layout]
    back = tmp_path / "back"
    out = audiollm_cli(["convert", "hf-to-megatron", "--hf", str(run["export"]), "--out", str(back), "--verify",
                        "--tolerance", "1e-4"], cwd=REPO)
    assert out.returncode == 0 and '"ok": true' in out.stdout, out.stdout[-3000:]
    assert json.loads((back / "audiollm_checkpoint.json").read_text())["parts"] == ["decoder", "encoder", "adapter"]
    for source, target in ((run["run"], tmp_path / "direct"), (back, tmp_path / "again")):
        done = audiollm_cli(["convert", "megatron-to-hf", "--megatron", str(source), "--out", str(target),
                             "--layout", "parts"], cwd=REPO)
        assert done.returncode == 0, done.stdout[-3000:]
    for part in (".", "whisper_encoder", "audio_adapter"):
        a, b = (load_file(str(d / part / "model.safetensors")) for d in (tmp_path / "direct", tmp_path / "again"))
        assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a), part


def test_a_sharded_export_streams_the_same_tensors_and_loads(exported, tmp_path, monkeypatch):
    """The export at a shard size of 64 KiB (the tiny model's scale of the 2 GiB one): many
    shards with an index, written into a directory that held the one-file export (none of
    its files left to be read beside them); the same tensors bit for bit, and
    AutoModelForCausalLM loads the shards into the model the one file gives."""
    import shutil

    from transformers import AutoModelForCausalLM

    from orchestrator.convert import hf_io
    from orchestrator.convert.hf_io import SafetensorsDir
    from orchestrator.convert.megatron_to_hf import convert

    run = exported["runs"]["pp2_llama"]
    target = tmp_path / "sharded"
    shutil.copytree(run["export"], target)
    monkeypatch.setattr(hf_io, "SHARD_BYTES", 64 * 1024)
    summary = convert(run["run"], target)
    index = json.loads((target / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 3 and shards[-1] == f"model-{len(shards):05d}-of-{len(shards):05d}.safetensors"
    assert sorted(p.name for p in target.glob("model*.safetensors")) == shards  # no model.safetensors left
    assert index["metadata"]["total_size"] == summary["bytes"]
    one, many = SafetensorsDir(run["export"]), SafetensorsDir(target)
    assert sorted(one) == sorted(many) == sorted(index["weight_map"])
    assert all(torch.equal(one[name], many[name]) for name in one)
    # A shard passes the limit only when a single tensor is larger than it.
    for shard in shards:
        names = [n for n, f in index["weight_map"].items() if f == shard]
        assert len(names) == 1 or sum(many[n].numel() * many[n].element_size() for n in names) <= 64 * 1024, shard
    models = [AutoModelForCausalLM.from_pretrained(d, trust_remote_code=True) for d in (run["export"], target)]
    a, b = (m.state_dict() for m in models)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_the_processor_builds_the_data_sides_prompt_and_features(exported):
    from transformers import AutoProcessor

    from orchestrator.data import mel
    from orchestrator.data.prompts import PromptBuilder
    from orchestrator.plan.schema.data import DataConfig

    run = exported["runs"]["tp1"]
    processor = AutoProcessor.from_pretrained(run["export"], trust_remote_code=True)
    stored = np.load(exported["clips"])
    clips = [stored[f"clip_{i}"] for i in range(3)]
    inputs = processor(audio=clips)
    features, lengths = mel.features(clips, 80, 500)  # the tiny encoder: 80 bins, a 5-s window
    assert torch.equal(inputs["feature_lengths"], lengths)
    # HF's log-mel against the project's: 1e-5, the bound tests/data/test_features.py holds them to
    assert (inputs["input_features"] - features).abs().max() < 1e-5
    builder = PromptBuilder(processor.tokenizer, DataConfig().prompt_template)
    for row, n in zip(inputs["input_ids"].tolist(), lengths.tolist()):
        sample = builder.build("x", [(((n - 1) // 2 + 1) // 5)])
        prompt = sample.tokens.tolist()[:sample.answer_start]
        assert row[len(row) - len(prompt):] == prompt  # left-padded
    with pytest.raises(ValueError, match="longer than the encoder's window of 5 s: cut it into windows first"):
        processor(audio=[np.zeros(16000 * 6, np.float32)])
    with pytest.raises(ValueError, match="must hold <SpeechHere> once"):
        processor(audio=clips[:1], text="no marker")


def test_a_converted_checkpoint_is_refused_as_a_model_directory_naming_the_way_out(exported, tmp_path):
    run = exported["runs"]["tp1"]
    back = tmp_path / "back"
    assert audiollm_cli(["convert", "hf-to-megatron", "--hf", str(run["export"]), "--out", str(back)],
                        cwd=REPO).returncode == 0
    out = audiollm_cli(["convert", "megatron-to-hf", "--megatron", str(back), "--out", str(tmp_path / "x"),
                        "--layout", "model"], cwd=REPO)
    assert out.returncode == 2 and "is a converted checkpoint" in out.stdout and "--layout parts" in out.stdout
    assert "Traceback" not in out.stdout


@pytest.mark.parametrize("layout", sorted(NEWER_THAN_4X))
def test_a_release_without_the_decoders_model_names_the_one_it_needs(exported, layout):
    """transformers 4.46 has no Qwen3 nor Gemma 3: loading such an export there says which
    release to install (not transformers' own 'unrecognized model'), as its model card does."""
    export = exported["runs"][layout]["export"]
    proc = subprocess.run([str(env_4x()), "-c", "import sys; from transformers import AutoModelForCausalLM; "
                           "AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)", str(export)],
                          capture_output=True, text=True, timeout=300, cwd=export.parent,
                          env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    model_type = json.loads((export / "config.json").read_text())["text_config"]["model_type"]
    assert proc.returncode != 0
    assert (f"this AudioLLM's decoder is a '{model_type}' model, which transformers 4.46.3 does not have: "
            f"install transformers>={NEWER_THAN_4X[layout]}") in proc.stderr, proc.stderr[-3000:]
    assert f"transformers>={NEWER_THAN_4X[layout]} (the first release with this decoder)" in (
        export / "README.md").read_text()


def test_the_model_card_states_the_releases_and_holds_no_local_path(exported):
    card = (exported["runs"]["tp2_sp"]["export"] / "README.md").read_text()
    assert "transformers>=4.46 (the oldest release its code supports)" in card
    assert "tested with transformers 4.46.3, 5.17.0, 5.25.0" in card
    assert str(exported["root"]) not in card and "/tmp/" not in card, card
    # how each figure was made: the normaliser, the scorer, the speed with its batch and device
    assert f"- {VAL_SET}: wer, normaliser audiollm (the project's own, orchestrator/scoring/text.py); scorer jiwer " \
        in card, card
    assert "after a warm-up batch) at batches of up to " in card and " samples on cpu: " in card, card


def test_the_remote_code_needs_only_torch_numpy_and_transformers():
    # The standard library's, and the optional reader the pipeline tries (ImportError: it falls back to ffmpeg).
    allowed = {"torch", "numpy", "transformers", "typing", "inspect", "io", "soundfile", "__future__", "re", "math",
               "difflib", "functools"}
    from orchestrator.hf_model import REMOTE_CODE_FILES

    for name in REMOTE_CODE_FILES:
        tree = ast.parse((REPO / "orchestrator" / "hf_model" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = set() if node.level else {node.module.split(".")[0]}
            else:
                continue
            assert roots <= allowed, (name, roots)


@pytest.mark.multiprocess
def test_transcribe_answers_files_as_eval_from_the_run_and_from_its_export(exported, tmp_path):
    """`audiollm transcribe` on the held-out clips as files: the answers `audiollm eval`
    gave (hence its WER), from the run's checkpoint and from the exported directory; the
    same clip as wav at 44.1 kHz in stereo, ogg and mp3 answered too; a recording longer
    than the encoder's window answered window by window (cut where it is quietest, the
    windows overlapping, the answers joined); an unreadable file and one too
    short for an audio token named and skipped, with exit status 1."""
    import soundfile as sf
    from streaming import LocalDataset

    from orchestrator.data.audio import load_audio, resample
    from orchestrator.scoring import metrics

    run = exported["runs"]["tp2_sp"]
    held_out = LocalDataset(local=str(exported["root"] / "corpus" / "val" / VAL_SET))
    files = []
    for i in range(len(held_out)):
        files.append(tmp_path / f"held_out_{i}.flac")
        files[-1].write_bytes(held_out[i]["audio"])
    clip = load_audio(held_out[0]["audio"], None, 16000)
    louder = np.stack([resample(clip, 16000, 44100)] * 2, axis=1)
    for name, fmt in (("stereo_44k.wav", "WAV"), ("clip.ogg", "OGG"), ("clip.mp3", "MP3")):
        sf.write(str(tmp_path / name), louder if fmt == "WAV" else clip, 44100 if fmt == "WAV" else 16000, format=fmt)
    window = 5 * 16000  # the tiny encoder's
    long = np.concatenate([clip] * (window // len(clip) + 1))  # 2 windows: a whole one and the rest
    assert window < len(long) < 2 * window
    cuts = windows(long, window)  # the first ends where it is quietest in its last second, the next overlaps it
    assert len(cuts) == 2 and cuts[0][1] <= window and cuts[1][0] == cuts[0][1] - window // 10, cuts
    for name, samples in (("long.wav", long), ("first_window.wav", long[slice(*cuts[0])]),
                          ("rest.wav", long[slice(*cuts[1])]), ("too_short.wav", clip[:400])):
        sf.write(str(tmp_path / name), samples, 16000, subtype="FLOAT")
    (tmp_path / "broken.flac").write_bytes(b"fLaC not really")
    extra = ["stereo_44k.wav", "clip.ogg", "clip.mp3", "long.wav", "first_window.wav", "rest.wav", "too_short.wav",
             "broken.flac"]
    argv = [*map(str, files), *(str(tmp_path / n) for n in extra), "--format", "jsonl", "--ctc-weight", "0",
            "--batch", "4"]
    answers = {}
    for source in (run["run"], run["export"]):
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "transcribe", str(source), *argv],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
        errors = proc.stderr.strip().splitlines()
        assert errors[-1] == f"2 of {len(files) + len(extra)} files skipped (named above)", proc.stderr[-3000:]
        assert any(line.startswith(f"{tmp_path / 'broken.flac'}: skipped: cannot decode") for line in errors)
        assert any(line.startswith(f"{tmp_path / 'too_short.wav'}: skipped: 0.025 s of audio is too short")
                   for line in errors)
        *rows, speed = [json.loads(line) for line in proc.stdout.splitlines()]
        assert [Path(r["file"]).name for r in rows] == [f.name for f in files] + extra[:-2]  # in order
        # the last line: the decoding speed, timed after a warm-up batch, over every answered window
        assert speed.keys() == {"rtfx", "audio_seconds", "decode_seconds", "batch", "device", "warmup"}, speed
        assert speed["warmup"] and speed["batch"] == 4 and speed["device"].startswith("cpu: ")
        assert speed["rtfx"] == pytest.approx(speed["audio_seconds"] / speed["decode_seconds"], rel=1e-2)
        assert speed["audio_seconds"] == pytest.approx(sum(r["seconds"] for r in rows), abs=0.01)
        answers[source] = {Path(r["file"]).name: r for r in rows}
    by_run, by_export = answers[run["run"]], answers[run["export"]]
    assert by_run == by_export
    said = [by_run[f.name]["text"] for f in files]
    assert said == [a.strip() for a in run["answers"]]
    references = [held_out[i]["text"] for i in range(len(held_out))]
    report = json.loads((run["run"] / "eval" / f"step_{ITERS:06d}.json").read_text())
    assert metrics.score("wer", metrics.statistics("wer", references, said)) == report[f"wer/{VAL_SET}"]
    # eval kept every answer beside its reference: the same answers
    kept = [json.loads(line) for line in
            (run["run"] / "eval" / "hypotheses" / f"step_{ITERS:06d}.jsonl").read_text().splitlines()]
    assert [k["hypothesis"].strip() for k in kept] == said and [k["reference"] for k in kept] == references
    assert by_run["long.wav"]["text"] == merge([t for t in (by_run["first_window.wav"]["text"],
                                                         by_run["rest.wav"]["text"]) if t])
    assert by_run["long.wav"]["seconds"] == round(len(long) / 16000, 3)
    assert all(by_run[n]["text"] is not None for n in ("stereo_44k.wav", "clip.ogg", "clip.mp3"))
