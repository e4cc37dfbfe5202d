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

    from orchestrator.models.speech import AudioAdapter
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
    base = [*train_overrides(pretrained["corpus"]), f"model.init_checkpoint={pretrained['converted']}",
            "data.validation=[]", "train.eval_generation=false", "model.adapter.ctc_weight=0",
            "model.spec_augment.enabled=false", "model.encoder.mask_padding=false", "train.iters=1",
            "optim.lr_warmup_iters=0",
            "logger=none", f"run.name={run_name}", f"run.output_root={pretrained['root'] / 'runs'}"]
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
    from orchestrator.model_params import encoder_frame_count

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


def _reference_step1_loss(overrides: list) -> float:
    """The trainer's first step (global batch of its micro-batches) through HF modules."""
    from transformers import Gemma2ForCausalLM, WhisperModel

    from orchestrator.compose import compose
    from orchestrator.data.loader import build_train_loader
    from orchestrator.resolve import to_object
    from tests.models.parity_script import reference_adapter

    cfg = to_object(compose(overrides))
    root = Path(cfg.model.init_checkpoint).parent
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
                                    # one reader per replica: the peer decodes the batches the reader sends
                                    ["parallel.tp=2", "launcher.gpus_per_node=2", "data.replica_reader=true", *DECODE],
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
    own model with its adapters unmerged."""
    from tests.train.jobs import result

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
    out = _cli(["convert", "megatron-to-hf", "--megatron", str(run_dir), "--out", str(export)], cwd=pretrained["root"])
    assert "LoRA merged into 16 linears" in out, out  # 4 layers x qkv, proj, fc1, fc2
    assert (export / "tokenizer.json").is_file() and (export / "audio_adapter" / "model.safetensors").is_file()
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("lora_export_script.py")), str(run_dir),
                           str(export), str(pretrained["root"] / "gemma2")], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    r = result(proc.stdout)
    print(f"LoRA export: {r}")
    assert r["lora_modules"] == 16
    assert r["lora_effect"] > 1e-3, r  # the adapters changed the model, so the merge is what is compared
    assert r["max_abs_logit_diff"] <= 1e-4, r


@pytest.mark.multiprocess
def test_a_checkpoint_that_does_not_fit_stops_the_job_before_the_first_step(pretrained):
    """One renamed encoder tensor: the job names both names and never trains a step."""
    from orchestrator.convert.dist_format import read_model_tensors, write_model_tensors

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
                 "train.eval_generation=false", "optim.lr_warmup_iters=0", "logger=none", f"run.name={name}",
                 f"run.output_root={pretrained['root'] / 'runs'}"]
    out = _cli(["train", *overrides], cwd=pretrained["root"])
    run_dir = pretrained["root"] / "runs" / "tiny_cpu_finetune" / name
    log = out + "\n".join(p.read_text() for p in run_dir.glob("**/*.log"))
    assert "starting fresh: CTC head (2 tensors), LoRA (" in log, log[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "val_loss" in rows[0], rows
