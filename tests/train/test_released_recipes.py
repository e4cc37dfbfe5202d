"""The recipes that fine-tune a released speech LLM (qwen2_audio_tp1, voxtral_mini_tp1,
voxtral_small_tp4) as they are but for the sizes: a tiny random model of the released class,
on a tokenizer of the release's layout (tests/data/family_tokenizers.py; Voxtral's Tekken
file, read through mistral-common, and so its 131072-token vocabulary), converted whole as the recipe's comment says,
stands in for the release (model.init_checkpoint), and the model section its config
describes replaces the full-size one; the machine shrinks to CPU processes. Each builds its
model and first batches through `audiollm train` with the recipe's parallel section,
prompt, placeholder, LoRA and freezes, and trains a few steps to finite losses."""

from __future__ import annotations

import json

import pytest

from orchestrator.convert import hf_to_megatron
from tests.data.conftest import WORDS
from tests.models.released_parity_script import model_overrides
from tests.data.family_tokenizers import voxtral_tokenizer_dir
from tests.models.tiny_models import hf_qwen2_audio, hf_voxtral
from tests.train.audiollm_runs import make_corpus, train_overrides
from tests.train.test_context_parallel_cli import _cli, _rows

ITERS = 3
RECIPES = {
    # 8 data-parallel GPUs -> 2 CPU processes; LoRA on the decoder, the encoder frozen, as the recipe has it
    "qwen2_audio_tp1": dict(kind="qwen2_audio", make=hf_qwen2_audio, tokenizer="qwen2_audio", processes=2,
                            window=250, extra=[]),
    "voxtral_mini_tp1": dict(kind="voxtral", make=hf_voxtral, tokenizer="tekken", processes=2, window=252, extra=[]),
    # full fine-tuning with TP and sequence parallelism; TP 2, as the tiny decoder has 2 key/value heads
    "voxtral_small_tp4": dict(kind="voxtral", make=hf_voxtral, tokenizer="tekken", processes=2, window=252,
                              extra=["parallel.tp=2"]),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from tests.data.family_tokenizers import build_family_tokenizer

    root = make_corpus(tmp_path_factory.mktemp("released_recipes"))
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5 + \
        ["system You are a helpful assistant. user Audio 1: Transcribe the speech. assistant"] * 5
    build_family_tokenizer("qwen2_audio", texts, root / "tokenizer_qwen2_audio")
    return root


@pytest.mark.multiprocess
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_released_models_recipe_shrunk_to_a_tiny_model_fine_tunes(corpus, tmp_path, recipe):
    from orchestrator.data.tokenizer_build import load_tokenizer
    from orchestrator.plan.compose import compose

    spec = RECIPES[recipe]
    # Voxtral's: its Tekken file (through mistral-common), whose ids are the release's
    tokenizer_dir = voxtral_tokenizer_dir() if spec["tokenizer"] == "tekken" else corpus / f"tokenizer_{spec['tokenizer']}"
    data = compose([f"+recipe={recipe}"]).data
    tokenizer = load_tokenizer(tokenizer_dir, data.audio_token)
    release, converted = tmp_path / "release", tmp_path / "release_megatron"
    # an encoder window of whole groups of Voxtral's 4 frames (5.04 s), clips up to it
    hf = spec["make"](seed=2, vocab_size=len(tokenizer), audio_token_id=tokenizer.convert_tokens_to_ids(data.audio_token),
                      max_source_positions=spec["window"])
    hf.save_pretrained(release, safe_serialization=True)
    assert hf_to_megatron.main(["--hf", str(release), "--out", str(converted)]) == 0

    shrink = [*model_overrides(hf.config.to_dict(), spec["kind"]), f"model.init_checkpoint={converted}",
              "model.backend=local", "launcher=local", "launcher.accelerator=cpu", "launcher.nodes=1",
              f"launcher.gpus_per_node={spec['processes']}", "launcher.cpus_per_task=1", *spec["extra"]]
    overrides = [o for o in train_overrides(corpus) if not o.startswith(("data.tokenizer=", "model.adapter.dropout="))]
    _cli(tmp_path, "train", f"+recipe={recipe}", *overrides, *shrink, f"data.tokenizer={tokenizer_dir}",
         "data.features_on=cpu", "data.max_audio_seconds=5", "optim.global_batch_size=4", "optim.micro_batch_size=1",
         f"train.iters={ITERS}", "train.eval_generation=false", f"run.name={recipe}",
         f"run.output_root={tmp_path / 'outputs'}")
    (run_dir,) = [m.parent for m in (tmp_path / "outputs").rglob("metrics.jsonl")]
    plan = json.loads((run_dir / "plan.json").read_text())
    config = plan["config"]
    assert config["recipe"] == recipe and config["model"]["adapter"]["kind"] == spec["kind"]
    # the recipe's own prompt, placeholder, BOS/EOS and token counting (the release's:
    # tests/data/test_released_prompts.py), LoRA and frozen encoder
    from orchestrator.plan.released_models import RELEASED

    assert {key: data[key] for key in RELEASED[spec["kind"]].prompt} == RELEASED[spec["kind"]].prompt
    for key in ("prompt_template", "response_suffix", "audio_token", "add_bos", "add_eos", "audio_tokens",
                "long_audio"):
        assert config["data"][key] == data[key], key
    assert config["model"]["encoder"]["freeze"]
    assert config["lora"]["rank"] == (0 if recipe == "voxtral_small_tp4" else 16)
    rows = _rows(run_dir)
    assert [r["step"] for r in rows] == list(range(1, ITERS + 1)) and all(0 < r["loss"] < 100 for r in rows)
