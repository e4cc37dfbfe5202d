"""A released speech LLM's HF directory (Voxtral, Qwen2-Audio) converts whole: its language
model verifies against the released class's text logits at TP 2 (real megatron
processes loading the checkpoint as a job does), its audio tower and projector land as
the encoder and the adapter bit for bit, and the checkpoint says what it is, so that a
run of another adapter kind starting from it is refused at plan time; given back
(`megatron-to-hf`), it is the released directory again, bit for bit. A speech LLM of a
kind audiollm does not take is refused in one line, naming what it takes."""

from __future__ import annotations

import json

import pytest
import torch

from safetensors.torch import load_file

from orchestrator.convert import hf_to_megatron, megatron_to_hf
from orchestrator.train.dist_format import read_model_tensors
from tests.models.tiny_models import hf_qwen2_audio, hf_voxtral

MAKERS = {"voxtral": hf_voxtral, "qwen2_audio": hf_qwen2_audio}


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_released_speech_llm_converts_whole_and_its_language_model_verifies(capsys, tmp_path, kind):
    src, out = tmp_path / "hf", tmp_path / "mg"
    hf = MAKERS[kind](seed=3)
    hf.save_pretrained(src, safe_serialization=True)
    code = hf_to_megatron.main(["--hf", str(src), "--out", str(out), "--verify", "--tp", "2", "--tolerance", "1e-4"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and result["max_abs_logit_diff"] <= 1e-4 and result["loss_diff"] <= 1e-5, result
    meta = json.loads((out / "audiollm_checkpoint.json").read_text())
    assert meta["parts"] == ["decoder", "encoder", "adapter"]
    assert meta["released"] == {"model_type": kind, "class": type(hf).__name__, "processor_files":
                                ["generation_config.json"]}
    stored = read_model_tensors(out)
    for part, module in (("encoder", hf.audio_tower), ("adapter", hf.multi_modal_projector)):
        theirs = module.state_dict()
        ours = {name[len(part) + 1:]: t for name, t in stored.items() if name.startswith(part + ".")}
        assert sorted(ours) == sorted(theirs), part
        assert all(torch.equal(ours[name], theirs[name]) for name in theirs), part
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter == ({"kind": "voxtral", "frame_stack": 4} if kind == "voxtral" else {"kind": "qwen2_audio"})
    whisper = json.loads((out / "whisper_config.json").read_text())
    assert (whisper["d_model"], whisper["encoder_layers"], whisper["num_mel_bins"]) == (32, 2, 80)

    # Given back (the default for it): the released class's directory, bit for bit
    back = tmp_path / "back"
    assert megatron_to_hf.main(["--megatron", str(out), "--out", str(back)]) == 0
    assert f"{type(hf).__name__}, as released" in capsys.readouterr().out
    assert sorted(p.name for p in back.iterdir()) == sorted(p.name for p in src.iterdir())
    for name in ("config.json", "generation_config.json"):
        assert (back / name).read_text() == (src / name).read_text(), name
    theirs, ours = load_file(src / "model.safetensors"), load_file(back / "model.safetensors")
    assert sorted(ours) == sorted(theirs)
    assert all(ours[n].dtype == theirs[n].dtype and torch.equal(ours[n], theirs[n]) for n in theirs)
    # ... which a layout of the project's own refuses, naming the one that holds it
    assert megatron_to_hf.main(["--megatron", str(out), "--out", str(tmp_path / "own"), "--layout", "model"]) == 2
    err = capsys.readouterr().err
    assert f"its adapter is of kind {kind}" in err and "--layout released" in err and "Traceback" not in err, err
    assert not (tmp_path / "own").exists()

    # A run of the project's own adapter kind cannot start from it: plan names the kind
    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import to_object
    from orchestrator.plan.rules.model import check_init_checkpoint

    cfg = to_object(compose(["+recipe=tiny_cpu", f"model.init_checkpoint={out}"]))
    said = [f.message for f in check_init_checkpoint(cfg.model, cfg.lora)]
    assert any("model.adapter.kind=layer_mix but a converted" in line and f"has {kind}" in line
               for line in said), said


def test_a_speech_llm_audiollm_does_not_take_is_refused_naming_what_it_takes(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "granite_speech"}))
    assert hf_to_megatron.main(["--hf", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "is a Granite Speech" in err and "model_type granite_speech" in err, err
    assert "Voxtral (VoxtralForConditionalGeneration), Qwen2-Audio (Qwen2AudioForConditionalGeneration)" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_voxtral_given_back_loads_in_the_newest_transformers_with_the_same_logits(tmp_path):
    """The export writes the hub's tensor names (language_model.*, audio_tower.*,
    multi_modal_projector.*), which transformers 5 renames as it loads them: in a clean
    environment of the newest release tested (tests/convert/test_hf_model.py NEWEST) the
    class gives the logits transformers 4 gives here, exactly."""
    import os
    import subprocess

    import numpy as np

    from tests.convert.test_hf_model import HERE, env_newest

    src, out, back = tmp_path / "hf", tmp_path / "mg", tmp_path / "back"
    hf = hf_voxtral(seed=6).eval()
    hf.save_pretrained(src, safe_serialization=True)
    assert hf_to_megatron.main(["--hf", str(src), "--out", str(out)]) == 0
    assert megatron_to_hf.main(["--megatron", str(out), "--out", str(back)]) == 0
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 249, (2, 40), generator=gen)
    ids[:, 2:17] = 249  # a 1.2-s window: 15 audio tokens each
    features = torch.randn(2, 80, 120, generator=gen)
    np.savez(tmp_path / "io.npz", input_ids=ids.numpy(), input_features=features.numpy())
    with torch.no_grad():
        ours = hf(input_ids=ids, input_features=features).logits
    proc = subprocess.run([str(env_newest()), str(HERE / "released_class_script.py"), "VoxtralForConditionalGeneration",
                           str(back), str(tmp_path / "io.npz"), str(tmp_path / "out.json")], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["transformers"].startswith("5.")
    assert torch.equal(torch.tensor(got["logits"]), ours), (torch.tensor(got["logits"]) - ours).abs().max()
