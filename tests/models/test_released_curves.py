"""A 60-step fine-tune of each released speech LLM as users run it (LoRA on the decoder, the
projector trained at half the rate, the encoder frozen; TP 2 with sequence parallelism;
`audiollm train`'s own Trainer, data loader and optimizer path, from the release converted
whole) follows a plain HF + torch loop on the released class over the same micro-batches
step by step (tests/models/released_curve_script.py, one launch per model)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from orchestrator.convert import hf_to_megatron
from tests.distributed_run import torchrun
from tests.models.released_parity_script import model_overrides
from tests.models.test_training_curves import BOUND, write_plan
from tests.models.tiny_models import hf_qwen2_audio, hf_voxtral
from tests.train.audiollm_runs import shared_corpus, train_overrides

SCRIPT = Path(__file__).with_name("released_curve_script.py")
STEPS = 60
KINDS = {
    # an encoder window of whole groups of Voxtral's 4 frames (5.04 s); its clips read whole windows
    "voxtral": dict(make=hf_voxtral, window=252, extra=["data.audio_tokens=window"]),
    "qwen2_audio": dict(make=hf_qwen2_audio, window=250, extra=[]),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_lora_fine_tune_of_the_released_model_follows_the_hf_loop(tmp_path, kind):
    from orchestrator.data.tokenizer_build import load_tokenizer

    spec = KINDS[kind]
    corpus = shared_corpus()
    tokenizer = load_tokenizer(str(corpus / "tokenizer"), "<audio>")
    release, converted = tmp_path / "release", tmp_path / "release_megatron"
    hf = spec["make"](seed=4, vocab_size=len(tokenizer), audio_token_id=tokenizer.convert_tokens_to_ids("<audio>"),
                      max_source_positions=spec["window"])
    hf.save_pretrained(release, safe_serialization=True)
    assert hf_to_megatron.main(["--hf", str(release), "--out", str(converted)]) == 0
    run_dir = write_plan(tmp_path / "run", [
        "+recipe=tiny_cpu", *train_overrides(corpus), *model_overrides(hf.config.to_dict(), kind),
        f"model.init_checkpoint={converted}", "model.encoder.freeze=true", "model.adapter.ctc_weight=0",
        "model.spec_augment.enabled=false", "lora=decoder_r16", "parallel.tp=2", "parallel.sp=true",
        "launcher.gpus_per_node=2", "data.features_on=cpu", "data.packing=false", "optim.micro_batch_size=2",
        "optim.global_batch_size=2", f"train.iters={STEPS}", "train.eval_generation=false",
        f"run.output_root={tmp_path / 'outputs'}", *spec["extra"]])
    output = torchrun(SCRIPT, 2, kind, str(release), str(run_dir), timeout=600)
    (found,) = [json.loads(m) for m in re.findall(r"^CURVE (.*)$", output, re.M)]
    project, reference = found["project"], found["hf"]
    assert len(project) == len(reference) == STEPS and not any(found["packed"])
    diffs = [abs(a - b) for a, b in zip(project, reference)]
    assert max(diffs) <= BOUND, (kind, max(diffs), diffs.index(max(diffs)), project[:3], reference[:3])
    assert project[-1] < project[0] - 0.5, (project[0], project[-1])  # and it learned
