"""HF Gemma2 (+ Whisper) <-> the project's dist_checkpointing checkpoint: bit-identical
round trips, --verify at several layouts (real megatron processes loading the
checkpoint as a job does vs the HF model), and the mistakes a converter can make
caught (norm offset by --verify and compare-weights, a renamed tensor by the loader)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import WhisperModel
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from orchestrator.convert import compare_weights, hf_to_megatron, megatron_to_hf
from orchestrator.train.dist_format import write_model_tensors
from orchestrator.convert.decoder_mapping import DecoderShape, hf_to_megatron_tensors
from orchestrator.convert.hf_io import SafetensorsDir
from tests.models.tiny_models import hf_gemma2, hf_gemma3, hf_llama, hf_qwen2, hf_qwen3, randomize, whisper_config


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf_gemma2")
    hf_gemma2(seed=0).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf_whisper")
    randomize(WhisperModel(whisper_config()), seed=5).save_pretrained(path, safe_serialization=True)
    return path


def _tensors(path: Path):
    return load_file(str(path / "model.safetensors"))


def _write_converted(hf_dir: Path, out: Path, edit) -> None:
    """A converter with a mistake: `edit(name, tensor)` applied to each decoder tensor."""
    shape = DecoderShape.from_hf_config(json.loads((hf_dir / "config.json").read_text()))
    tensors = ((edit("language_model." + n, t)) for n, t in hf_to_megatron_tensors(SafetensorsDir(hf_dir), shape))
    write_model_tensors(out, tensors, shape.num_layers)


@pytest.mark.parametrize("make,dtype", [(hf_gemma2, torch.float32), (hf_gemma2, torch.bfloat16),
                                        (hf_llama, torch.float32), (hf_qwen2, torch.float32),
                                        (hf_qwen3, torch.bfloat16), (hf_gemma3, torch.float32)],
                         ids=["gemma2-fp32", "gemma2-bf16", "llama-fp32", "qwen2-fp32", "qwen3-bf16", "gemma3-fp32"])
def test_hf_megatron_hf_round_trip_is_bit_identical(tmp_path, make, dtype):
    src = tmp_path / "hf"
    make(seed=1).to(dtype).save_pretrained(src, safe_serialization=True)
    assert hf_to_megatron.main(["--hf", str(src), "--out", str(tmp_path / "mg")]) == 0
    assert (tmp_path / "mg" / "metadata.json").is_file()  # a dist_checkpointing directory
    assert megatron_to_hf.main(["--megatron", str(tmp_path / "mg"), "--out", str(tmp_path / "back")]) == 0
    a, b = _tensors(src), _tensors(tmp_path / "back")
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype == dtype, name
        assert torch.equal(a[name], b[name]), name
    assert json.loads((src / "config.json").read_text()) == json.loads((tmp_path / "back" / "config.json").read_text())


def test_whisper_encoder_travels_and_comes_back_as_a_hf_encoder(tmp_path, hf_dir, whisper_dir):
    out = tmp_path / "mg"
    assert hf_to_megatron.main(["--hf", str(hf_dir), "--out", str(out), "--whisper", str(whisper_dir)]) == 0
    assert json.loads((out / "audiollm_checkpoint.json").read_text())["parts"] == ["decoder", "encoder"]
    assert megatron_to_hf.main(["--megatron", str(out), "--out", str(tmp_path / "back")]) == 0
    source = WhisperModel.from_pretrained(whisper_dir).encoder.state_dict()
    back = WhisperEncoder.from_pretrained(tmp_path / "back" / "whisper_encoder").state_dict()
    assert sorted(back) == sorted(source) and all(torch.equal(back[k], source[k]) for k in source)
    # the export converts again, encoder included (found beside the decoder)
    assert hf_to_megatron.main(["--hf", str(tmp_path / "back"), "--out", str(tmp_path / "again")]) == 0
    assert json.loads((tmp_path / "again" / "audiollm_checkpoint.json").read_text())["parts"] == ["decoder", "encoder"]


def _verify(capsys, hf_dir, out, *extra):
    code = hf_to_megatron.main(["--hf", str(hf_dir), "--out", str(out), "--verify", "--tolerance", "1e-4", *extra])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    return code, json.loads(last)


@pytest.mark.multiprocess
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)])
def test_one_conversion_verifies_at_every_layout(capsys, tmp_path, hf_dir, tp, pp):
    code, result = _verify(capsys, hf_dir, tmp_path / "mg", "--tp", str(tp), "--pp", str(pp))
    assert code == 0, result
    assert (result["tp"], result["pp"]) == (tp, pp) and result["seq_len"] > 8  # longer than the sliding window
    assert result["max_abs_logit_diff"] <= 1e-4 and result["loss_diff"] <= 1e-5, result
    print(f"verify tp={tp} pp={pp}: {result}")


@pytest.mark.multiprocess
@pytest.mark.parametrize("make", [hf_llama, hf_qwen2, hf_qwen3, hf_gemma3], ids=["llama", "qwen2", "qwen3", "gemma3"])
def test_each_family_converts_and_verifies_at_tp2_pp2(capsys, tmp_path, make):
    """Llama 3's shape in small (untied output layer, RoPE scaling), Qwen2.5's (q/k/v
    biases, tied), Qwen3's (QK-norm, untied) and Gemma 3's (sandwich and QK-norms, two
    RoPE bases): each tensor travels (the output layer as its own where it is untied, the
    biases split by KV groups, the QK-norms replicated) and loads at another layout."""
    src = tmp_path / "hf"
    make(seed=2).save_pretrained(src, safe_serialization=True)
    code, result = _verify(capsys, src, tmp_path / "mg", "--tp", "2", "--pp", "2")
    assert code == 0, result
    assert result["max_abs_logit_diff"] <= 1e-4 and result["loss_diff"] <= 1e-5, result
    from orchestrator.train.dist_format import stored_model_tensors

    stored = {name: tuple(t.global_shape) for name, t in stored_model_tensors(tmp_path / "mg").items()}
    family = make.__name__[len("hf_"):]
    assert stored.get("language_model.output_layer.weight") == (None if family in ("qwen2", "gemma3") else (250, 64))
    layer = "language_model.decoder.layers.self_attention."
    assert (layer + "linear_qkv.bias" in stored) == (family == "qwen2")
    assert stored.get(layer + "q_layernorm.weight") == {"qwen3": (4, 32), "gemma3": (6, 16)}.get(family)


@pytest.mark.multiprocess
def test_verify_fails_on_a_converter_that_forgets_the_norm_offset(tmp_path, hf_dir):
    from orchestrator.convert.verify import verify

    out = tmp_path / "mg"
    _write_converted(hf_dir, out, lambda n, t: (n, t + 1.0 if n.endswith("layernorm.weight") else t))
    result = verify(hf_dir, out)
    assert result["max_abs_logit_diff"] > 1e-2, result


@pytest.mark.multiprocess
def test_a_renamed_tensor_is_refused_by_the_loader_naming_both(tmp_path, hf_dir):
    from orchestrator.convert.verify import verify

    out = tmp_path / "mg"
    renamed = "language_model.decoder.final_norm.weight"
    _write_converted(hf_dir, out, lambda n, t: (renamed if n == "language_model.decoder.final_layernorm.weight" else n, t))
    with pytest.raises(RuntimeError) as err:
        verify(hf_dir, out)
    assert "the model needs tensors the checkpoint lacks: language_model.decoder.final_layernorm.weight" in str(err.value)
    assert f"the checkpoint holds tensors the model does not have: {renamed}" in str(err.value)


def test_compare_weights_flags_the_norm_offset_mistake(tmp_path, hf_dir, capsys):
    good = tmp_path / "good"
    assert hf_to_megatron.main(["--hf", str(hf_dir), "--out", str(good)]) == 0
    capsys.readouterr()
    assert compare_weights.main([str(hf_dir), str(good)]) == 0
    assert "all" in capsys.readouterr().out
    # a converter that treats megatron's norm weight as the full scale (1 + w)
    bad = tmp_path / "bad"
    _write_converted(hf_dir, bad, lambda n, t: (n, t + 1.0 if "layernorm" in n else t))
    (bad / "hf_config.json").write_text((hf_dir / "config.json").read_text())
    (bad / "audiollm_checkpoint.json").write_text((good / "audiollm_checkpoint.json").read_text())
    assert compare_weights.main([str(hf_dir), str(bad)]) == 1
    flagged = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if ": " in line]
    hf_names = load_file(str(hf_dir / "model.safetensors"))
    norms = sorted(n for n in hf_names if "norm" in n)
    assert len(norms) == 4 * 4 + 1 and sorted(flagged) == norms


def test_bad_sources_get_clear_errors(tmp_path, capsys):
    """One line and exit status 2, no traceback, nothing written."""
    assert hf_to_megatron.main(["--hf", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "config.json not found: --hf must be a HF checkpoint directory" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "phi3"}))
    assert hf_to_megatron.main(["--hf", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "model_type 'phi3' is not supported: the decoder families are gemma2, llama, qwen2, qwen3, gemma3_text" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
    # megatron-to-hf says what to fix in one line, without a traceback
    assert megatron_to_hf.main(["--megatron", str(tmp_path), "--out", str(tmp_path / "back")]) == 2
    assert "is a HF checkpoint (model_type 'phi3'); convert it first" in capsys.readouterr().err


@pytest.mark.multiprocess
def test_gemma3s_multimodal_checkpoint_converts_its_language_model_and_verifies(capsys, tmp_path):
    """Gemma 3 from 4b up is published as Gemma3ForConditionalGeneration: its language model
    (under language_model.model.*, the vision tower beside it) converts, verifies against
    the multimodal model's text logits, and comes back as a Gemma3ForCausalLM of the same
    tensors."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from tests.models.tiny_models import GEMMA3

    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = Gemma3Config(text_config=dict(GEMMA3), vision_config=vision, mm_tokens_per_image=4)
    multimodal = randomize(Gemma3ForConditionalGeneration(config), seed=5).eval()
    src = tmp_path / "gemma3_mm"
    multimodal.save_pretrained(src, safe_serialization=True)
    code, result = _verify(capsys, src, tmp_path / "mg", "--tp", "2")
    assert code == 0 and result["max_abs_logit_diff"] <= 1e-4 and result["loss_diff"] <= 1e-5, result
    assert megatron_to_hf.main(["--megatron", str(tmp_path / "mg"), "--out", str(tmp_path / "back")]) == 0
    back = _tensors(tmp_path / "back")
    language_model = {k: v for k, v in multimodal.state_dict().items() if k.startswith("model.language_model.")}
    assert sorted(back) == sorted("model." + k[len("model.language_model."):] for k in language_model)
    for name, tensor in language_model.items():
        assert torch.equal(back["model." + name[len("model.language_model."):]], tensor), name
    assert json.loads((tmp_path / "back" / "config.json").read_text())["architectures"] == ["Gemma3ForCausalLM"]


def test_a_layout_training_refuses_is_refused_by_verify_before_any_worker(tmp_path, capsys):
    """`convert hf-to-megatron --verify` accepts the layouts `plan` accepts for training:
    a Gemma 3 of one KV head at --tp 2 (which no training run can have) is refused in one
    line, exit 2, before anything is converted."""
    from orchestrator.cli import main
    from tests.models.tiny_models import GEMMA3

    src = tmp_path / "gemma3"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({**GEMMA3, "num_key_value_heads": 1, "model_type": "gemma3_text"}))
    assert main(["convert", "hf-to-megatron", "--hf", str(src), "--out", str(tmp_path / "out"), "--verify",
                 "--tp", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--verify --tp 2 --pp 1 is a layout no training run of this decoder" in err
    assert "model.decoder.num_query_groups (1 KV heads) is not divisible by parallel.tp (2)" in err
    assert not (tmp_path / "out").exists()
