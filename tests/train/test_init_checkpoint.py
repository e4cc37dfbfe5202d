"""Pretrained weights end to end: a tiny random HF Gemma2 + HF Whisper (+ adapter
weights) saved with save_pretrained, converted once (`audiollm convert hf-to-megatron`),
trained from at TP=1, TP=2 and PP=2 through `audiollm train` (local launcher, real
trainer); the first step's loss equals the same batch's loss through the HF reference
(HF Gemma2 + HF WhisperEncoder + the adapter written out in plain torch), with the
encoder in Whisper's own full-window mode and in `model.encoder.mask_padding` mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.distributed_run import REPO
from tests.train.audiollm_runs import make_corpus, train_overrides

# The tiny_audiollm model section (conf/model/tiny_audiollm.yaml), as HF configs.
GEMMA2 = dict(vocab_size=512, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, sliding_window=64,
              attn_logit_softcapping=50.0, final_logit_softcapping=30.0, max_position_embeddings=1024,
              rms_norm_eps=1e-6, rope_theta=10000.0)
WHISPER = dict(d_model=128, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=512, num_mel_bins=80,
               max_source_positions=250, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=64,
               vocab_size=100, pad_token_id=99, bos_token_id=98, eos_token_id=99, decoder_start_token_id=98,
               max_target_positions=32)
FRAME_STACK = 5
STEP1_TOLERANCE = 1e-4  # fp32, both sides; the bound


def _hf_models(seed: int = 0):
    from transformers import Gemma2Config, Gemma2ForCausalLM, WhisperConfig, WhisperModel

    from orchestrator.models.adapters import AudioAdapter
    from tests.models.tiny_models import randomize

    gemma = randomize(Gemma2ForCausalLM(Gemma2Config(**GEMMA2, attn_implementation="eager")), seed).eval()
    whisper = randomize(WhisperModel(WhisperConfig(**WHISPER, attn_implementation="eager")), seed + 1).eval()
    adapter = AudioAdapter(WHISPER["encoder_layers"], WHISPER["d_model"], GEMMA2["hidden_size"], FRAME_STACK)
    randomize(adapter, seed + 2)
    return gemma, whisper, adapter


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """(corpus, HF dirs, converted checkpoint)."""
    from safetensors.torch import save_file

    from orchestrator.convert import hf_to_megatron

    root = tmp_path_factory.mktemp("pretrained")
    corpus = make_corpus(root / "corpus")
    gemma, whisper, adapter = _hf_models()
    gemma.save_pretrained(root / "gemma2", safe_serialization=True)
    whisper.save_pretrained(root / "whisper", safe_serialization=True)
    (root / "adapter").mkdir()
    save_file({k: v.contiguous() for k, v in adapter.state_dict().items()}, str(root / "adapter" / "model.safetensors"))
    assert hf_to_megatron.main(["--hf", str(root / "gemma2"), "--whisper", str(root / "whisper"),
                                "--adapter", str(root / "adapter"), "--out", str(root / "converted")]) == 0
    return {"root": root, "corpus": corpus, "converted": root / "converted"}


def _overrides(pretrained, run_name: str, extra=()) -> list:
    """The step-1 run's overrides; a key in `extra` replaces the default one."""
    # The command line chooses lora= in some runs: a group choice names its recipe.
    base = ["+recipe=tiny_cpu", *train_overrides(pretrained["corpus"]), f"model.init_checkpoint={pretrained['converted']}",
            "data.validation=[]", "train.eval_generation=false", "model.adapter.ctc_weight=0",
            "model.spec_augment.enabled=false", "model.encoder.mask_padding=false", "train.iters=1",
            "optim.lr_warmup_iters=0", f"run.name={run_name}", f"run.output_root={pretrained['root'] / 'runs'}"]
    replaced = {o.split("=", 1)[0] for o in extra}
    return [o for o in base if o.split("=", 1)[0] not in replaced] + list(extra)


def _cli(args: list, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def _masked_reference_states(encoder, features: torch.Tensor, lengths: list) -> list:
    """`mask_padding` mode as its definition says, without a mask: each clip alone, HF's
    convolutions over its features (and the zeros the model pads with past them), then
    the HF encoder layers over only the clip's own frames, the final LayerNorm on the
    last. Returns, per clip, the N layer outputs [1, frames, d]."""
    from orchestrator.plan.model_params import encoder_frame_count

    per_clip = []
    for i, n in enumerate(lengths):
        x = F.pad(features[i:i + 1], (0, 4))  # conv2's last kept frame reads up to 2 mel frames past n
        x = F.gelu(encoder.conv2(F.gelu(encoder.conv1(x)))).permute(0, 2, 1)
        frames = encoder_frame_count(n)
        hidden = x[:, :frames] + encoder.embed_positions.weight[:frames]
        states = []
        for layer in encoder.layers:
            out = layer(hidden, attention_mask=None, layer_head_mask=None)
            hidden = out[0] if isinstance(out, tuple) else out
            states.append(hidden)
        states[-1] = encoder.layer_norm(hidden)
        per_clip.append(states)
    return per_clip


def _reference_step1_loss(overrides: list, gemma=None) -> float:
    """The trainer's first step (global batch of its micro-batches) through HF modules
    (`gemma`: this HF Gemma2 instead of the pretrained one)."""
    from transformers import Gemma2ForCausalLM, WhisperModel

    from orchestrator.plan.compose import compose
    from orchestrator.data.loader import build_train_loader
    from orchestrator.plan.resolve import to_object
    from tests.models.parity_script import reference_adapter

    # The reference reads the log-mel the host loader computes, whatever the run's data.features_on.
    cfg = to_object(compose([*overrides, "data.features_on=cpu"]))
    root = Path(cfg.model.init_checkpoint).parent
    if gemma is None:
        gemma = Gemma2ForCausalLM.from_pretrained(root / "gemma2", attn_implementation="eager").eval()
    encoder = WhisperModel.from_pretrained(root / "whisper", attn_implementation="eager").encoder.eval()
    from safetensors.torch import load_file

    adapter = {"adapter." + k: v for k, v in load_file(str(root / "adapter" / "model.safetensors")).items()}
    mbs = cfg.optim.micro_batch_size
    loader = build_train_loader(cfg.data, cfg.model.encoder, cfg.model.adapter, mbs, 0, 1, cfg.data.seed)
    total, tokens = 0.0, 0.0
    window = 2 * WHISPER["max_source_positions"]
    with torch.no_grad():
        for _ in range(cfg.optim.global_batch_size // mbs):
            batch = next(loader)
            assert not batch["packed"]
            lengths = [int(n) for n in batch["audio_lengths"]]
            if cfg.model.encoder.mask_padding:
                audio = torch.cat([reference_adapter(states, adapter, [n], FRAME_STACK) for n, states in
                                   zip(lengths, _masked_reference_states(encoder, batch["audio_features"], lengths))])
            else:  # Whisper's own mode: the whole window, padding included
                features = F.pad(batch["audio_features"], (0, window - batch["audio_features"].shape[-1]))
                states = encoder(features, output_hidden_states=True).hidden_states[1:]
                audio = reference_adapter(states, adapter, lengths, FRAME_STACK)
            ids = batch["tokens"]
            embeds = gemma.model.embed_tokens(ids)
            embeds[ids == int(batch["audio_token_id"])] = audio
            logits = gemma(inputs_embeds=embeds).logits
            per_token = F.cross_entropy(logits.flatten(0, 1).double(), batch["labels"].flatten(), reduction="none")
            mask = batch["loss_mask"].flatten().double()
            total += float((per_token * mask).sum())
            tokens += float(mask.sum())
    return total / tokens


# Greedy decoding of one validation batch inside training, at the end of the step.
DECODE = ["train.eval_generation=true", "train.eval_generation_batches=1", "train.eval_generation_max_new_tokens=12",
          "train.eval_interval=1", "train.eval_iters=1"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", [["parallel.tp=1", "model.encoder.mask_padding=true"],
                                    # one reader per replica: the peer decodes the batches the reader sends,
                                    # their waveforms made into log-mel in the step (the GPU recipes' way)
                                    ["parallel.tp=2", "launcher.gpus_per_node=2", "data.replica_reader=true",
                                     "data.features_on=device", *DECODE],
                                    ["parallel.pp=2", "launcher.gpus_per_node=2", "train.eval_at_start=true",
                                     *DECODE]], ids=["tp1_masked_encoder", "tp2", "pp2"])
def test_first_step_loss_from_a_converted_hf_checkpoint_equals_hf(pretrained, layout, request):
    name = "from_hf_" + request.node.callspec.id
    overrides = _overrides(pretrained, name, layout)
    if "train.eval_generation=true" in layout:  # a validation set to evaluate and decode
        overrides = [o for o in overrides if o != "data.validation=[]"]
    out = _cli(["train", *overrides], cwd=pretrained["root"])
    run_dir = pretrained["root"] / "runs" / "tiny_cpu" / name
    log = "\n".join(p.read_text() for p in run_dir.glob("**/*.log")) + out
    assert "init_checkpoint: loaded" in log and "starting fresh: nothing" in log, log[-4000:]
    assert "random initialisation skipped" in log  # the checkpoint overwrites what megatron draws
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if "train.eval_at_start=true" in overrides:  # the pretrained model's validation loss, before any step
        assert rows[0]["step"] == 0 and rows[0]["val_loss"] > 0 and "loss" not in rows[0], rows[0]
        rows = rows[1:]
    reference = _reference_step1_loss(overrides)
    print(f"{name}: step-1 loss {rows[0]['loss']:.8f}, HF reference {reference:.8f}")
    assert abs(rows[0]["loss"] - reference) <= STEP1_TOLERANCE, (rows[0]["loss"], reference)
    if "model.encoder.mask_padding=true" in layout:  # the mode changes the loss, so the bound tells them apart
        full_window = _reference_step1_loss(overrides + ["model.encoder.mask_padding=false"])
        assert abs(rows[0]["loss"] - full_window) > 100 * STEP1_TOLERANCE, (rows[0]["loss"], full_window)
    if "train.eval_generation=true" in layout:
        # Decoded inside training at TP=2 (with the replica reader) / PP=2 (each rank reading), the step-1
        # checkpoint scores as `audiollm eval` does: in
        # one process after the TP=2 run, at TP=2 (two processes the command starts) after the PP=2 run.
        at_layout = ["--tp", "2"] if "parallel.pp=2" in layout else []
        _cli(["eval", str(run_dir), *at_layout], cwd=pretrained["root"])
        evaluated = json.loads((run_dir / "eval" / "step_000001.json").read_text())
        assert rows[-1]["wer/utterances"] > 0 and rows[-1]["wer/all"] > 0, rows[-1]
        assert (rows[-1]["wer/utterances"], rows[-1]["wer/all"]) == (evaluated["wer/utterances"], evaluated["wer/all"])
        assert rows[-1]["val_loss"] == pytest.approx(evaluated["val_loss"], abs=1e-5)


@pytest.mark.multiprocess
def test_lora_run_from_the_converted_checkpoint_exports_to_hf_with_lora_merged(pretrained):
    """LoRA fine-tune at TP=2 from the converted HF checkpoint -> `megatron-to-hf` of the
    run (LoRA merged, TP=2 checkpoint read whole) -> HF Gemma2 logits equal the project's
    own model with its adapters unmerged, and so do PEFT's of the `--lora peft` export."""
    name = "lora_tp2"
    lora = ["lora=decoder_r16", "lora.rank=4", "lora.alpha=8",
            "lora.lr_groups=[{name: lora, patterns: ['*lora_*'], lr_scale: 1.0}, {name: rest, patterns: ['*'], lr_scale: 0.0}]"]
    overrides = _overrides(pretrained, name, ["parallel.tp=2", "launcher.gpus_per_node=2", "train.iters=4",
                                              "optim.lr=1e-2", "optim.min_lr=1e-2", *lora])
    out = _cli(["train", *overrides], cwd=pretrained["root"])
    run_dir = pretrained["root"] / "runs" / "tiny_cpu" / name
    log = out + "\n".join(p.read_text() for p in run_dir.glob("**/*.log"))
    assert "starting fresh: LoRA (32 tensors)" in log, log[-3000:]  # A and B of 16 linears, added after the load
    export = pretrained["root"] / "export"
    out = _cli(["convert", "megatron-to-hf", "--megatron", str(run_dir), "--out", str(export), "--layout", "parts"],
               cwd=pretrained["root"])
    assert "LoRA merged into 16 linears" in out, out  # 4 layers x qkv, proj, fc1, fc2
    assert (export / "tokenizer.json").is_file() and (export / "audio_adapter" / "model.safetensors").is_file()
    r = _compare_exports(run_dir, export, pretrained)
    print(f"LoRA export: {r}")
    assert r["lora_modules"] == 16
    assert r["lora_effect"] > 1e-3, r  # the adapters changed the model, so the merge is what is compared
    assert r["max_abs_logit_diff"] <= 1e-4, r
    # the same run as a PEFT adapter beside the un-merged base: PEFT's logits are the merged export's
    assert r["peft_base_vs_base"] == 0.0 and r["peft_vs_merged"] <= 1e-4, r
    _check_model_directories(run_dir, pretrained)


def _check_model_directories(run_dir: Path, pretrained: dict) -> None:
    """The LoRA run as one HF model directory (LoRA merged), and as one whose decoder gets
    its PEFT adapter (`--lora peft`), loaded where only torch, transformers 4.46 and peft
    are: PeftModel.from_pretrained on the model's decoder answers the held-out clips as
    the merged directory does, next-token logits within the fp32 bound, and the adapter
    moves them by far more than that."""
    from tests.convert.test_hf_model import LOGIT_BOUND, answers_without_the_project, env_4x, write_held_out_clips
    from tests.train.audiollm_runs import VAL_SET

    root = pretrained["root"]
    merged, adapted = root / "lora_model", root / "lora_model_peft"
    _cli(["convert", "megatron-to-hf", "--megatron", str(run_dir), "--out", str(merged)], cwd=root)
    out = _cli(["convert", "megatron-to-hf", "--megatron", str(run_dir), "--out", str(adapted), "--lora", "peft"],
               cwd=root)
    assert "one AudioLLM model directory with its processor, peft_lora/ (28 LoRA modules)" in out, out
    clips = write_held_out_clips(pretrained["corpus"] / "val" / VAL_SET, root / "lora_clips.npz")
    python3 = env_4x()
    plain = answers_without_the_project(python3, clips, [merged, adapted], root / "lora_plain.json")
    with_peft = answers_without_the_project(python3, clips, [adapted], root / "lora_peft.json", "--peft")
    merged_out, base_out = (plain["exports"][str(d)] for d in (merged, adapted))
    peft_out = with_peft["exports"][str(adapted)]
    gap = lambda a, b: float(np.abs(np.asarray(a["logits"]) - np.asarray(b["logits"])).max())  # noqa: E731
    assert peft_out["texts"] == merged_out["texts"], (peft_out["texts"], merged_out["texts"])
    assert gap(peft_out, merged_out) <= LOGIT_BOUND < gap(base_out, merged_out) / 10, (gap(peft_out, merged_out),
                                                                                      gap(base_out, merged_out))


def _compare_exports(run_dir: Path, export: Path, pretrained: dict) -> dict:
    """tests/train/lora_export_script.py on the run, its merged export and its PEFT export
    (written here with `--lora peft`)."""
    from tests.train.jobs import result

    peft_export = export.with_name(export.name + "_peft")
    out = _cli(["convert", "megatron-to-hf", "--megatron", str(run_dir), "--out", str(peft_export), "--lora", "peft",
                "--layout", "parts"],
               cwd=pretrained["root"])
    assert "peft_lora/ (28 LoRA modules)" in out, out  # 4 layers x q, k, v, o, gate, up, down
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("lora_export_script.py")), str(run_dir),
                           str(export), str(pretrained["root"] / "gemma2"), str(peft_export)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return result(proc.stdout)


@pytest.mark.multiprocess
def test_a_peft_adapter_made_elsewhere_is_fine_tuned_on_and_exported_back_as_peft(pretrained):
    """A PEFT LoRA adapter made by `peft` on the pretrained Gemma2 (its own A per q/k/v and
    gate/up) -> `hf-to-megatron --peft` -> a TP=1 LoRA run from it: the first step's loss is
    the HF reference's with the adapter (PEFT's merge_and_unload) -> `megatron-to-hf --lora
    peft` of the run: PEFT's logits of that adapter equal the merged export's and the
    project's own. A run whose lora.alpha does not fit stops before its first step."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import Gemma2ForCausalLM

    root = pretrained["root"]
    peft_model = get_peft_model(Gemma2ForCausalLM.from_pretrained(root / "gemma2"),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                                              "gate_proj", "up_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:  # non-zero, so that the adapter changes the loss
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    peft_model.save_pretrained(root / "peft_made_elsewhere")
    out = _cli(["convert", "hf-to-megatron", "--hf", str(root / "gemma2"), "--whisper", str(root / "whisper"),
                "--adapter", str(root / "adapter"), "--peft", str(root / "peft_made_elsewhere"),
                "--out", str(root / "converted_peft"), "--verify"], cwd=root)
    assert '"ok": true' in out, out  # --verify loads the base of a checkpoint that holds LoRA factors
    # q/k/v stacked: rank 3 x 4, every linear padded to it, alpha 8 x 12 / 4 keeps the scaling
    assert "with lora.rank=12 lora.alpha=24 lora.targets=[linear_fc1,linear_fc2,linear_proj,linear_qkv]" in out, out
    lora = ["lora=decoder_r16", "lora.rank=12", "lora.alpha=24",
            "lora.lr_groups=[{name: lora, patterns: ['*lora_*'], lr_scale: 1.0}, {name: rest, patterns: ['*'], lr_scale: 0.0}]"]
    name = "peft_tp1"
    overrides = _overrides(pretrained, name, [f"model.init_checkpoint={root / 'converted_peft'}", "train.iters=2",
                                              "optim.lr=1e-2", "optim.min_lr=1e-2", *lora])
    bad = subprocess.run([sys.executable, "-m", "orchestrator.cli", "train",
                          *[o for o in overrides if not o.startswith("run.name=")], "run.name=peft_bad_alpha",
                          "lora.alpha=8"], capture_output=True, text=True, timeout=300, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"})
    bad_log = bad.stdout + bad.stderr + "\n".join(p.read_text() for p in (root / "runs").glob("**/peft_bad_alpha/**/*.log"))
    assert bad.returncode != 0 and "set lora.rank=12 lora.alpha=24" in bad_log, bad_log[-3000:]
    out = _cli(["train", *overrides], cwd=root)
    run_dir = root / "runs" / "tiny_cpu" / name
    log = out + "\n".join(p.read_text() for p in run_dir.glob("**/*.log"))
    assert "LoRA factors from it: 32 tensors; starting fresh: nothing" in log, log[-3000:]  # 4 layers x 4 linears
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    merged = PeftModel.from_pretrained(Gemma2ForCausalLM.from_pretrained(root / "gemma2", attn_implementation="eager"),
                                       root / "peft_made_elsewhere").merge_and_unload().eval()
    reference = _reference_step1_loss(overrides, gemma=merged)
    without = _reference_step1_loss(overrides)
    print(f"PEFT import: step-1 loss {rows[0]['loss']:.8f}, HF + PEFT {reference:.8f}, HF alone {without:.8f}")
    # the adapter moves the loss by more than ten times the bound: the bound tells loaded from not loaded
    assert abs(rows[0]["loss"] - reference) <= STEP1_TOLERANCE < abs(reference - without) / 10
    export = root / "export_peft_run"
    _cli(["convert", "megatron-to-hf", "--megatron", str(run_dir), "--out", str(export), "--layout", "parts"], cwd=root)
    r = _compare_exports(run_dir, export, pretrained)
    print(f"PEFT round trip: {r}")
    assert r["lora_effect"] > 1e-3 and r["max_abs_logit_diff"] <= 1e-4, r
    assert r["peft_base_vs_base"] == 0.0 and r["peft_vs_merged"] <= 1e-4, r


@pytest.mark.multiprocess
def test_a_checkpoint_that_does_not_fit_stops_the_job_before_the_first_step(pretrained):
    """One renamed encoder tensor: the job names both names and never trains a step."""
    from orchestrator.train.dist_format import read_model_tensors, write_model_tensors

    bad = pretrained["root"] / "renamed"
    tensors = read_model_tensors(pretrained["converted"])
    tensors["encoder.layer_norm.scale"] = tensors.pop("encoder.layer_norm.weight")
    write_model_tensors(bad, tensors.items(), GEMMA2["num_hidden_layers"])
    name = "renamed"
    overrides = [o if not o.startswith("model.init_checkpoint=") else f"model.init_checkpoint={bad}"
                 for o in _overrides(pretrained, name)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "train", *overrides], capture_output=True,
                          text=True, timeout=300, cwd=pretrained["root"], env=env)
    run_dir = pretrained["root"] / "runs" / "tiny_cpu" / name
    log = proc.stdout + proc.stderr + "\n".join(p.read_text() for p in run_dir.glob("**/*.log"))
    assert proc.returncode != 0
    assert "the model needs tensors the checkpoint lacks: encoder.layer_norm.weight" in log, log[-4000:]
    assert "the checkpoint holds tensors the model does not have: encoder.layer_norm.scale" in log
    assert not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip()


@pytest.mark.multiprocess
def test_the_finetune_recipe_builds_from_a_converted_checkpoint_and_trains(pretrained):
    """recipes/tiny_cpu_finetune.yaml as written (LoRA on decoder and encoder, adapter in
    full, evaluation before the first step), on this module's converted checkpoint and
    tone corpus instead of the demo's export and accent corpus."""
    corpus = pretrained["corpus"]
    name = "finetune_recipe"
    overrides = ["+recipe=tiny_cpu_finetune", f"model.init_checkpoint={pretrained['converted']}",
                 *[o for o in train_overrides(corpus) if not o.startswith("optim.lr")],
                 "data.demo_corpus=null", "data.demo_corpus_accent=null", "train.iters=2", "train.eval_iters=1",
                 "train.eval_generation=false", "optim.lr_warmup_iters=0", f"run.name={name}",
                 f"run.output_root={pretrained['root'] / 'runs'}"]
    out = _cli(["train", *overrides], cwd=pretrained["root"])
    run_dir = pretrained["root"] / "runs" / "tiny_cpu_finetune" / name
    log = out + "\n".join(p.read_text() for p in run_dir.glob("**/*.log"))
    assert "starting fresh: CTC head (2 tensors), LoRA (" in log, log[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "val_loss" in rows[0], rows


@pytest.mark.multiprocess
def test_a_lora_runs_checkpoints_leave_the_frozen_base_in_the_init_checkpoint_and_resume_exactly(pretrained):
    """train.save_frozen_weights=false (the default): a LoRA run from a converted checkpoint
    saves its LoRA factors, adapter and optimizer, records where its frozen base is, and
    reads it back from there at a resume and an evaluation: 2 + 2 steps give the losses of 4
    steps in one launch that saved every weight (train.save_frozen_weights=true), both as
    gemma2_whisper_tp1 trains (the distributed optimizer, here over two data-parallel ranks;
    the split run saving in the background), and `audiollm eval` scores the last checkpoint
    as the run did. Once the converted checkpoint changes, the run's resume, a run from its
    checkpoint, its evaluation (here and as a job) and its export are refused before they
    start, naming both."""
    import shutil

    from orchestrator.plan.checkpoint_dirs import FROZEN_SOURCE, frozen_source
    from orchestrator.train.dist_format import process_group, stored_model_tensors

    root = pretrained["root"]
    source = root / "converted_for_frozen"  # a copy: this test changes it at the end
    shutil.copytree(pretrained["converted"], source)
    lora = ["lora=decoder_r16", "lora.rank=4", "lora.alpha=8", "optim.lr=1e-2", "optim.min_lr=1e-2",
            f"model.init_checkpoint={source}", "train.save_interval=2", "train.keep_last=5",
            # as gemma2_whisper_tp1 trains: the distributed optimizer, over two data-parallel ranks
            "parallel.distributed_optimizer=true", "launcher.gpus_per_node=2"]
    # with the validation set: the run scores itself, then `audiollm eval` scores its checkpoint
    whole, split = ([o for o in _overrides(pretrained, name, [*lora, *extra]) if o != "data.validation=[]"]
                    for name, extra in (("frozen_whole", ["train.iters=4", "train.save_frozen_weights=true"]),
                                        ("frozen_split", ["train.iters=2", "train.async_save=true"])))
    _cli(["train", *whole], cwd=root)
    _cli(["train", *split], cwd=root)
    out = _cli(["train", *split[:-1], "train.iters=4"], cwd=root)
    runs = root / "runs" / "tiny_cpu"
    log = out + "\n".join(p.read_text() for p in (runs / "frozen_split").glob("**/*.log"))
    assert "resumed from" in log and "checkpoints leave out" in log, log[-3000:]
    losses = {name: [r["loss"] for r in map(json.loads, (runs / name / "metrics.jsonl").read_text().splitlines())
                     if "loss" in r] for name in ("frozen_whole", "frozen_split")}
    assert losses["frozen_split"] == losses["frozen_whole"], losses
    _cli(["eval", str(runs / "frozen_split")], cwd=root)  # its latest checkpoint, step 4
    scored = json.loads((runs / "frozen_split" / "eval" / "step_000004.json").read_text())["val_loss"]
    trained = [r["val_loss"] for r in map(json.loads, (runs / "frozen_split" / "metrics.jsonl").read_text().splitlines())
               if "val_loss" in r][-1]
    assert scored == pytest.approx(trained, abs=1e-5)

    base = "language_model.decoder.layers.self_attention.linear_qkv.weight"
    with process_group():
        from megatron.core import dist_checkpointing

        own = {name: set(dist_checkpointing.load_tensors_metadata(str(runs / name / "checkpoints" / "step_000004")))
               for name in ("frozen_whole", "frozen_split")}
        converted = set(stored_model_tensors(source))
        readable = set(stored_model_tensors(runs / "frozen_split" / "checkpoints" / "step_000004"))
    assert base in own["frozen_whole"] and base not in own["frozen_split"], own["frozen_split"]
    assert any(".lora_" in key for key in own["frozen_split"]) and converted <= readable
    record = frozen_source(runs / "frozen_split" / "checkpoints" / "step_000002")
    assert record["source"] == str(source.resolve()) and base in record["tensors"]
    # exactly the frozen tensors: the adapted linears' base weights, and Whisper's fixed
    # positions (this recipe trains the rest of the encoder, the norms and the embedding)
    adapted = {f"language_model.decoder.layers.{name}.weight" for name in
               ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")}
    assert set(record["tensors"]) == adapted | {"encoder.embed_positions.weight"}, record["tensors"]
    assert not (runs / "frozen_whole" / "checkpoints" / "step_000004" / FROZEN_SOURCE).exists()

    # The base changes under the run: its resume, a run from its checkpoint, its evaluation
    # (here and as a job) and its export are refused before they start, naming both places.
    with open(source / "hf_config.json", "a") as handle:
        handle.write(" ")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    run = str(runs / "frozen_split")
    for argv in (["train", *split[:-1], "train.iters=6"],
                 ["train", *_overrides(pretrained, "from_frozen", [f"model.init_checkpoint={run}"])],
                 ["eval", run, "--all"], ["eval", run, "launcher=local"],
                 ["convert", "megatron-to-hf", "--megatron", run, "--out", str(root / "frozen_export")]):
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True,
                              text=True, timeout=300, cwd=root, env=env)
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0 and f"in {source.resolve()}, the model.init_checkpoint" in said, said[-3000:]
        assert "Traceback" not in said, said[-3000:]
        assert "whose files changed since (hf_config.json has " in said and "frozen_split/checkpoints/step_" in said, \
            said[-3000:]
