"""The tiny AudioLLM with each released model's adapter kind (orchestrator/plan/
adapter_kinds.py: voxtral, qwen2_audio) builds its model and first batches through
`audiollm train` at TP 2 with sequence parallelism, and trains a few steps to finite
losses: the data path counts each clip's placeholders as the kind's model makes its
audio tokens (voxtral: whole windows; qwen2_audio: the clip's frames pooled by 2), or
the first step would refuse the batch."""

from __future__ import annotations

import json

import pytest

from tests.train.audiollm_runs import shared_corpus, train_overrides
from tests.train.test_context_parallel_cli import _cli, _rows

ITERS = 3
KINDS = {
    # 252 encoder positions (5.04 s): whole groups of voxtral's 4 frames; its clips read the whole window
    "voxtral": ["model.adapter.frame_stack=null", "model.encoder.max_source_positions=252", "data.audio_tokens=window"],
    "qwen2_audio": ["model.adapter.frame_stack=null"],
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_tiny_audiollm_with_a_released_models_adapter_trains(tmp_path, kind):
    out = tmp_path / "outputs"
    _cli(tmp_path, "train", "+recipe=tiny_cpu", *train_overrides(shared_corpus()), f"model.adapter.kind={kind}",
         "model.adapter.dropout=null", *KINDS[kind], "parallel.tp=2", "parallel.sp=true", "launcher.gpus_per_node=2",
         "data.features_on=cpu", f"train.iters={ITERS}", "train.eval_generation=false", f"run.name={kind}",
         f"run.output_root={out}")
    (run_dir,) = [m.parent for m in out.rglob("metrics.jsonl")]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["config"]["model"]["adapter"]["kind"] == kind
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, ITERS + 1)) and all(0 < r["loss"] < 100 for r in rows)
