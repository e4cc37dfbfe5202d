"""The project's model of a released speech LLM (Voxtral, Qwen2-Audio: its adapter kind,
its encoder, its decoder family) built by the job's builder and loaded from the released
checkpoint's conversion, against the released HF class: logits on a batch of two clips
of different lengths (padded) and text within 1e-4 and the loss within 1e-5 (fp32, a
few hundred products a logit summed in another order), at TP 1, TP 2 with sequence
parallelism and PP 2; greedy answers equal the released class's `generate` with the KV
cache (TP 1, TP 2) and without it (TP 1) (tests/models/released_parity_script.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.convert import hf_to_megatron
from tests.distributed_run import torchrun
from tests.models.tiny_models import hf_qwen2_audio, hf_voxtral

SCRIPT = Path(__file__).with_name("released_parity_script.py")
MAKERS = {"voxtral": hf_voxtral, "qwen2_audio": hf_qwen2_audio}


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_the_released_models_logits_on_audio_and_text(tmp_path, kind):
    src, ckpt = tmp_path / "hf", tmp_path / "mg"
    MAKERS[kind](seed=4).save_pretrained(src, safe_serialization=True)
    hf_to_megatron.convert(src, ckpt)
    output = torchrun(SCRIPT, 2, kind, str(src), str(ckpt), timeout=600)
    results = {r["case"]: r for r in map(json.loads, re.findall(r"^RESULT (.*)$", output, re.M))}
    generated = {case: results.pop(case) for case in [c for c in results if "_generate" in c]}
    assert sorted(results) == ["pp2", "tp1", "tp2_sp"], output[-3000:]
    assert sorted(generated) == ["tp1_generate", "tp1_generate_no_cache", "tp2_sp_generate"], output[-3000:]
    for case, r in generated.items():  # greedy tokens as the released class's generate gives them
        assert r["ours"] == r["theirs"] and len(r["ours"][0]) == 8, (case, r)
    for case, r in results.items():
        assert r["fresh"] == {}, (case, r)  # every weight came from the released checkpoint
        assert r["max_abs_logit_diff"] <= 1e-4 and r["loss_diff"] <= 1e-5, (case, r)
    # Voxtral's clips are whole windows (15 tokens each); Qwen2-Audio's their own frames pooled by 2
    assert results["tp1"]["audio_tokens"] == ([15, 15] if kind == "voxtral" else [30, 19])
