"""The recipes of the decoder families beside Gemma2 (qwen2_5_whisper_tp1,
llama3_whisper_tp2) as they are but for the sizes: their parallel section, their prompt,
placeholder and BOS setting, on a tokenizer of the family's layout
(tests/data/family_tokenizers.py); the decoder shrunk to the tiny AudioLLM's sizes in
the recipe's family, the machine to CPU processes. Each builds its model and first
batches through `audiollm train` and trains a few steps to finite losses. So does each
family's tiny CPU recipe (tiny_cpu_llama, _qwen2, _qwen3, _gemma3) as it is."""

from __future__ import annotations

import json

import pytest

from tests.data.conftest import WORDS
from tests.train.audiollm_runs import make_corpus, train_overrides
from tests.train.test_context_parallel_cli import _cli, _rows

ITERS = 3
# The recipe's decoder family at the tiny AudioLLM's sizes (Gemma2's keys set to null).
TINY_FAMILY = ["model=tiny_audiollm", "model.decoder.sliding_window=null", "model.decoder.query_pre_attn_scalar=null",
               "model.decoder.attn_logit_softcap=null", "model.decoder.final_logit_softcap=null"]
RECIPES = {
    # 8 data-parallel GPUs -> 2 CPU processes; LoRA on the decoder, as the recipe has it
    "qwen2_5_whisper_tp1": dict(family="qwen2", tokenizer="qwen2", processes=2,
                                extra=["model.allow_frozen_random=true"]),
    # TP 2 with sequence parallelism kept; 4 nodes of 16 data-parallel ranks -> 1
    "llama3_whisper_tp2": dict(family="llama", tokenizer="llama", processes=2,
                               extra=["model.decoder.rope_scaling_factor=8", "model.decoder.tie_embeddings=false"]),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from tests.data.family_tokenizers import build_family_tokenizer

    root = make_corpus(tmp_path_factory.mktemp("family_recipes"))
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5 + ["user assistant Transcribe:"] * 5
    for layout in ("llama", "qwen2"):
        build_family_tokenizer(layout, texts, root / f"tokenizer_{layout}")
    return root


@pytest.mark.multiprocess
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_familys_recipe_shrunk_to_a_tiny_decoder_trains(corpus, tmp_path, recipe):
    spec = RECIPES[recipe]
    shrink = [*TINY_FAMILY, f"model.decoder.family={spec['family']}", "model.backend=local",
              "model.init_checkpoint=null", "launcher=local", "launcher.accelerator=cpu", "launcher.nodes=1",
              f"launcher.gpus_per_node={spec['processes']}", "launcher.cpus_per_task=1", *spec["extra"]]
    overrides = [o for o in train_overrides(corpus) if not o.startswith("data.tokenizer=")]
    _cli(tmp_path, "train", f"+recipe={recipe}", *shrink, *overrides, f"data.tokenizer={corpus}/tokenizer_{spec['tokenizer']}",
         "data.features_on=cpu", "data.max_audio_seconds=5", "optim.global_batch_size=4", "optim.micro_batch_size=2", f"train.iters={ITERS}",
         "train.eval_generation=false", f"run.name={recipe}", f"run.output_root={tmp_path / 'outputs'}")
    (run_dir,) = [m.parent for m in (tmp_path / "outputs").rglob("metrics.jsonl")]
    plan = json.loads((run_dir / "plan.json").read_text())
    recipe_cfg = plan["config"]
    assert plan["config"]["recipe"] == recipe and recipe_cfg["model"]["decoder"]["family"] == spec["family"]
    # the recipe's own prompt, placeholder and BOS setting, not the demo's
    from orchestrator.plan.decoder_families import PROMPTS

    assert {key: recipe_cfg["data"][key] for key in PROMPTS[spec["family"]]} == PROMPTS[spec["family"]]
    if recipe == "llama3_whisper_tp2":
        assert (plan["tp"], plan["sp"]) == (2, True) and plan["megatron_args"]["use_distributed_optimizer"]
    else:
        assert plan["config"]["lora"]["rank"] == 16 and plan["megatron_args"]["add_qkv_bias"]
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, ITERS + 1)) and all(0 < r["loss"] < 100 for r in rows)


# The tiny recipe of each family (tiny_cpu with the family's decoder) as it is, on the test
# corpus's datasets and tokenizer (the demo corpus's layout) instead of the demo corpus.
TINY = {"tiny_cpu_llama": dict(untie_embeddings_and_output_weights=True, use_rope_scaling=True, rotary_base=500000),
        "tiny_cpu_qwen2": dict(add_qkv_bias=True, untie_embeddings_and_output_weights=True),
        "tiny_cpu_qwen3": dict(qk_layernorm=True, untie_embeddings_and_output_weights=True),
        "tiny_cpu_gemma3": dict(qk_layernorm=True, num_layers=6, window_size=[63, 0])}


@pytest.mark.parametrize("recipe", sorted(TINY))
def test_the_familys_tiny_cpu_recipe_builds_its_model_and_trains(corpus, tmp_path, recipe):
    _cli(tmp_path, "train", f"+recipe={recipe}", *train_overrides(corpus), "data.features_on=cpu",
         f"train.iters={ITERS}", "train.eval_generation=false", f"run.name={recipe}",
         f"run.output_root={tmp_path / 'outputs'}")
    (run_dir,) = [m.parent for m in (tmp_path / "outputs").rglob("metrics.jsonl")]
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["config"]["model"]["decoder"]["family"] == recipe.removeprefix("tiny_cpu_")
    assert {key: plan["megatron_args"][key] for key in TINY[recipe]} == TINY[recipe]
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, ITERS + 1)) and all(0 < r["loss"] < 100 for r in rows)
