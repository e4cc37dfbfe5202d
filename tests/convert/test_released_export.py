"""A fine-tune of a released speech LLM goes back as its class. A tiny random
Qwen2AudioForConditionalGeneration, saved with its processor, is converted and fine-tuned
here as users run it (`audiollm train` at TP 2 with sequence parallelism: the release's
tokenizer as the conversion kept it, its prompt, LoRA on the decoder, the projector trained,
the encoder frozen and so left in the converted checkpoint); `megatron-to-hf` of the run writes, by default, a directory that plain
transformers loads as Qwen2AudioForConditionalGeneration with its own AutoProcessor. Its
audio tower is the release's, its projector the run's; with `--lora peft` the base is the
release's decoder and PEFT's merge of the adapter gives the merged export's weights; and
the exported model answers a clip through its processor, and `audiollm transcribe` of the
directory answers as its class and processor do on the chat turn the run trained with."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from orchestrator.convert import hf_to_megatron, megatron_to_hf
from tests.models.released_parity_script import model_overrides
from orchestrator.plan.decoder_families import data_overrides
from orchestrator.plan.released_models import RELEASED
from tests.data.conftest import WORDS
from tests.data.family_tokenizers import build_family_tokenizer
from tests.models.tiny_models import hf_qwen2_audio
from tests.train.audiollm_runs import shared_corpus, train_overrides
from tests.train.test_context_parallel_cli import _cli, _rows

ITERS = 3


@pytest.mark.multiprocess
def test_a_fine_tuned_qwen2_audio_goes_back_as_its_class_with_its_processor(tmp_path, capsys):
    from transformers import AutoProcessor, Qwen2AudioForConditionalGeneration, Qwen2AudioProcessor, WhisperFeatureExtractor

    from orchestrator.data.tokenizer_build import load_tokenizer

    corpus = shared_corpus()
    # a tokenizer of Qwen2-Audio-Instruct's layout (<|AUDIO|>, its chat markers), and the
    # release's prompt (its processor's chat turn: tests/data/test_released_prompts.py)
    tokenizer_dir = build_family_tokenizer("qwen2_audio", [" ".join(WORDS)] * 5 + [
        "system You are a helpful assistant. user Audio 1: Transcribe the speech. assistant"] * 5, tmp_path / "tok")
    tokenizer = load_tokenizer(str(tokenizer_dir), "<|AUDIO|>")
    audio_id = tokenizer.convert_tokens_to_ids("<|AUDIO|>")
    src, converted = tmp_path / "released", tmp_path / "released_megatron"
    hf = hf_qwen2_audio(seed=5, vocab_size=len(tokenizer), audio_token_id=audio_id, max_source_positions=250)
    hf.save_pretrained(src, safe_serialization=True)
    Qwen2AudioProcessor(WhisperFeatureExtractor(feature_size=80, chunk_length=5), tokenizer).save_pretrained(str(src))
    assert hf_to_megatron.main(["--hf", str(src), "--out", str(converted)]) == 0

    out = tmp_path / "outputs"
    overrides = [o for o in train_overrides(corpus) if not o.startswith("data.tokenizer=")]
    _cli(tmp_path, "train", "+recipe=tiny_cpu", *overrides, *model_overrides(hf.config.to_dict(), "qwen2_audio"),
         f"data.tokenizer={converted / 'released_processor'}", *data_overrides(RELEASED["qwen2_audio"].prompt),
         f"model.init_checkpoint={converted}", "model.encoder.freeze=true", "model.adapter.ctc_weight=0",
         "model.adapter.dropout=null", "model.spec_augment.enabled=false", "lora=decoder_r16", "lora.rank=4", "lora.alpha=8",
         "optim.lr=1e-2", "parallel.tp=2", "parallel.sp=true", "launcher.gpus_per_node=2", "data.features_on=cpu",
         f"train.iters={ITERS}", f"train.save_interval={ITERS}", "train.eval_generation=false", "run.name=qwen2_audio_ft",
         f"run.output_root={out}")
    (run_dir,) = [m.parent for m in out.rglob("metrics.jsonl")]
    assert [r["step"] for r in _rows(run_dir)] == list(range(1, ITERS + 1))

    merged, peft = tmp_path / "merged", tmp_path / "peft"
    assert megatron_to_hf.main(["--megatron", str(run_dir), "--out", str(merged)]) == 0
    said = capsys.readouterr().out
    assert "Qwen2AudioForConditionalGeneration, as released" in said and "LoRA merged into 16 linears" in said, said
    assert megatron_to_hf.main(["--megatron", str(run_dir), "--out", str(peft), "--lora", "peft"]) == 0

    release = hf.eval()
    tuned = Qwen2AudioForConditionalGeneration.from_pretrained(merged).eval()
    ours, theirs = tuned.state_dict(), release.state_dict()
    assert sorted(ours) == sorted(theirs)
    frozen = [n for n in theirs if n.startswith("audio_tower.")]
    assert frozen and all(torch.equal(ours[n], theirs[n]) for n in frozen)  # the encoder: the release's
    for part in ("multi_modal_projector.", "language_model.model.layers.0.self_attn.q_proj."):
        assert any(not torch.equal(ours[n], theirs[n]) for n in theirs if n.startswith(part)), part  # trained

    from peft import PeftModel

    base = Qwen2AudioForConditionalGeneration.from_pretrained(peft)
    base_state = base.state_dict()
    assert all(torch.equal(base_state[n], theirs[n]) for n in theirs if n.startswith("language_model."))
    peft_merged = PeftModel.from_pretrained(base, peft / "peft_lora").merge_and_unload().state_dict()
    assert sorted(peft_merged) == sorted(ours)
    # the same update B A, merged by PEFT in fp32 and by the export in fp64
    worst = max((peft_merged[n] - ours[n]).abs().max().item() for n in ours)
    assert worst <= 1e-6, worst

    processor = AutoProcessor.from_pretrained(merged)
    assert type(processor).__name__ == "Qwen2AudioProcessor"
    clip = np.sin(np.linspace(0, 900, 24000)).astype(np.float32) * 0.1
    inputs = processor(text="<|audio_bos|><|AUDIO|><|audio_eos|>", audio=[clip], sampling_rate=16000,
                       return_tensors="pt")
    assert int((inputs["input_ids"] == audio_id).sum()) == 37  # 1.5 s: 150 frames, 75 after the convolutions, 37 pooled
    inputs.pop("token_type_ids", None)  # the test tokenizer's (Qwen2's own returns none)
    with torch.no_grad():
        answer = tuned.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert answer.shape[1] == inputs["input_ids"].shape[1] + 4

    # `audiollm transcribe` takes the directory: the class and its processor, its chat turn of the clip
    import soundfile

    from orchestrator.eval import transcribe

    soundfile.write(tmp_path / "clip.wav", clip, 16000)
    assert transcribe.main([str(merged), str(tmp_path / "clip.wav"), "--max-new-tokens", "4", "--device", "cpu",
                            "--format", "jsonl"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    turn = [{"role": "user", "content": [{"type": "audio", "audio_url": "clip"},
                                         {"type": "text", "text": "Transcribe the speech."}]}]
    prompt = processor(text=processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=False),
                       audio=[soundfile.read(tmp_path / "clip.wav", dtype="float32")[0]], sampling_rate=16000,
                       return_tensors="pt")
    prompt.pop("token_type_ids", None)
    with torch.no_grad():
        ids = tuned.generate(**prompt, max_new_tokens=4, do_sample=False)
    expected = processor.batch_decode(ids[:, prompt["input_ids"].shape[1]:], skip_special_tokens=True)[0]
    assert lines[0]["file"].endswith("clip.wav") and lines[0]["text"] == expected, (lines, expected)
