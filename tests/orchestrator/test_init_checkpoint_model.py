"""model.init_checkpoint of another model is refused at plan time (issue: the job died
loading it after the queue): a converted checkpoint's hf_config.json and
whisper_config.json, and a run checkpoint's plan.json, are compared with the config's
model section, naming each key, both values and where the checkpoint's comes from."""

import json

import pytest
from omegaconf import OmegaConf

from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import to_object
from orchestrator.plan.validate import validate

WHISPER_KEYS = {"d_model": "d_model", "num_layers": "encoder_layers", "num_heads": "encoder_attention_heads",
                "ffn_dim": "encoder_ffn_dim", "num_mel_bins": "num_mel_bins"}


def _dist_checkpoint(path):
    path.mkdir(parents=True)
    (path / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    return path


def _converted(tmp_path, recipe: str, **changed) -> str:
    """A converted checkpoint of the recipe's own model, with HF config values `changed`."""
    from orchestrator.convert.decoder_mapping import decoder_hf_config

    model = OmegaConf.to_container(compose([f"+recipe={recipe}"]).model, resolve=True)
    ckpt = _dist_checkpoint(tmp_path / "converted")
    hf = {**decoder_hf_config(model["decoder"]), **{k: v for k, v in changed.items() if k != "num_mel_bins"}}
    (ckpt / "hf_config.json").write_text(json.dumps(hf))
    whisper = {theirs: model["encoder"][ours] for ours, theirs in WHISPER_KEYS.items()}
    whisper.update({k: v for k, v in changed.items() if k == "num_mel_bins"})
    (ckpt / "whisper_config.json").write_text(json.dumps(whisper))
    return str(ckpt)


def _errors(overrides):
    return [str(f) for f in validate(to_object(compose(overrides)), "plan")
            if f.severity == "error" and f.rule == "init_checkpoint"]


@pytest.mark.parametrize("recipe", ["tiny_cpu", "tiny_cpu_llama", "tiny_cpu_qwen2"])
def test_the_models_own_converted_checkpoint_is_accepted(tmp_path, recipe):
    assert _errors([f"+recipe={recipe}", f"model.init_checkpoint={_converted(tmp_path, recipe)}"]) == []


@pytest.mark.parametrize("recipe, checkpoint, changed, said", [
    # a llama recipe over a gemma2 checkpoint
    ("tiny_cpu_llama", "tiny_cpu", {}, ["model.decoder.family=llama but a converted gemma2 checkpoint has gemma2"]),
    # a qwen model over a llama checkpoint
    ("tiny_cpu_qwen2", "tiny_cpu_llama", {}, ["model.decoder.family=qwen2", "has llama"]),
    # family=qwen3 over a qwen2 checkpoint of the same shapes
    ("tiny_cpu_qwen3", "tiny_cpu_qwen2", {}, ["model.decoder.family=qwen3 but a converted qwen2 checkpoint"]),
    # a 128-bin encoder under a config of fewer bins
    ("tiny_cpu", "tiny_cpu", {"num_mel_bins": 128}, ["model.encoder.num_mel_bins=", "has 128"]),
    ("tiny_cpu", "tiny_cpu", {"hidden_size": 256}, ["model.decoder.hidden_size=128 but", "has 256"]),
])
def test_another_models_checkpoint_is_refused_naming_key_and_values(tmp_path, recipe, checkpoint, changed, said):
    errors = _errors([f"+recipe={recipe}", f"model.init_checkpoint={_converted(tmp_path, checkpoint, **changed)}"])
    assert len(errors) == 1 and "holds another model" in errors[0], errors
    for text in said:
        assert text in errors[0], errors[0]


def test_a_run_checkpoint_of_another_model_is_refused(tmp_path):
    run = tmp_path / "run"
    _dist_checkpoint(run / "checkpoints" / "step_5")
    (run / "checkpoints" / "latest").write_text("step_5")
    model = OmegaConf.to_container(compose(["+recipe=tiny_cpu_llama"]).model, resolve=True)
    (run / "plan.json").write_text(json.dumps({"config": {"model": model}}))
    errors = _errors(["+recipe=tiny_cpu", f"model.init_checkpoint={run}"])
    assert len(errors) == 1 and f"a checkpoint of the run {run} has llama" in errors[0], errors
    assert _errors(["+recipe=tiny_cpu_llama", f"model.init_checkpoint={run}"]) == []


def test_a_checkpoint_of_a_model_no_family_has_is_refused(tmp_path):
    ckpt = _converted(tmp_path, "tiny_cpu", model_type="mamba")
    (errors,) = _errors(["+recipe=tiny_cpu", f"model.init_checkpoint={ckpt}"])
    assert "its decoder" in errors and "mamba" in errors
