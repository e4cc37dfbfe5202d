"""HF Gemma2 <-> project megatron checkpoint: bit-identical round trips, --verify at
TP=1 and TP=2 (real megatron processes vs the HF model), and compare-weights catching
the zero-centred-norm offset mistake."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import WhisperModel

from orchestrator.convert import compare_weights, hf_to_megatron, megatron_to_hf
from orchestrator.convert.checkpoint import read_shards, shard_path
from orchestrator.convert.gemma2_mapping import Gemma2Shape, check_divisibility
from tests.models.tiny_models import hf_gemma2, randomize, whisper_config


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


@pytest.mark.parametrize("tp,pp,dtype", [(1, 1, torch.float32), (2, 2, torch.float32), (2, 1, torch.bfloat16)])
def test_hf_megatron_hf_round_trip_is_bit_identical(tmp_path, tp, pp, dtype):
    src = tmp_path / "hf"
    hf_gemma2(seed=1).to(dtype).save_pretrained(src, safe_serialization=True)
    assert hf_to_megatron.main(["--hf", str(src), "--out", str(tmp_path / "mg"), "--tp", str(tp), "--pp", str(pp)]) == 0
    assert len(list((tmp_path / "mg" / "model").glob("*.pt"))) == tp * pp
    assert megatron_to_hf.main(["--megatron", str(tmp_path / "mg"), "--out", str(tmp_path / "back")]) == 0
    a, b = _tensors(src), _tensors(tmp_path / "back")
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype == dtype, name
        assert torch.equal(a[name], b[name]), name
    assert (src / "config.json").read_text() == (tmp_path / "back" / "config.json").read_text()


def test_whisper_encoder_travels_with_the_first_stage(tmp_path, hf_dir, whisper_dir):
    out = tmp_path / "mg"
    assert hf_to_megatron.main(["--hf", str(hf_dir), "--out", str(out), "--tp", "2", "--pp", "2",
                                "--whisper", str(whisper_dir)]) == 0
    shards = read_shards(out)
    source = {k[len("encoder."):]: v for k, v in load_file(str(whisper_dir / "model.safetensors")).items()
              if k.startswith("encoder.")}
    for t in (0, 1):
        enc = {k[len("encoder."):]: v for k, v in shards[(t, 0)].items() if k.startswith("encoder.")}
        assert sorted(enc) == sorted(source) and all(torch.equal(enc[k], source[k]) for k in source)
        assert not any(k.startswith("encoder.") for k in shards[(t, 1)])
    assert megatron_to_hf.main(["--megatron", str(out), "--out", str(tmp_path / "back")]) == 0
    back = load_file(str(tmp_path / "back" / "whisper_encoder" / "model.safetensors"))
    assert all(torch.equal(back["encoder." + k], v) for k, v in source.items())


def test_sharding_refuses_indivisible_layouts():
    shape = Gemma2Shape(num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                        ffn_hidden_size=96, vocab_size=250)
    with pytest.raises(ValueError, match=r"num_key_value_heads \(2\) is not divisible by tp \(4\)"):
        check_divisibility(shape, 4, 1)
    with pytest.raises(ValueError, match=r"num_hidden_layers \(4\) is not divisible by pp \(3\)"):
        check_divisibility(shape, 1, 3)


def _verify(capsys, hf_dir, out, *extra):
    code = hf_to_megatron.main(["--hf", str(hf_dir), "--out", str(out), "--verify", "--tolerance", "1e-4", *extra])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    return code, json.loads(last)


@pytest.mark.multiprocess
@pytest.mark.parametrize("tp", [1, 2])
def test_verify_reports_parity_as_last_json_line(capsys, tmp_path, hf_dir, tp):
    code, result = _verify(capsys, hf_dir, tmp_path / "mg", "--tp", str(tp))
    assert code == 0, result
    assert result["tp"] == tp and result["seq_len"] > 8  # longer than the sliding window
    assert result["max_abs_logit_diff"] <= 1e-4 and result["loss_diff"] <= 1e-5, result
    print(f"verify tp={tp}: {result}")


@pytest.mark.multiprocess
def test_verify_fails_on_a_wrong_conversion(tmp_path, hf_dir):
    from orchestrator.convert.verify import verify

    out = tmp_path / "mg"
    assert hf_to_megatron.main(["--hf", str(hf_dir), "--out", str(out)]) == 0
    path = shard_path(out, 0, 0)
    state = torch.load(path, weights_only=True)
    torch.save({k: (v + 1.0 if k.endswith("layernorm.weight") else v) for k, v in state.items()}, path)
    result = verify(hf_dir, out)
    assert result["max_abs_logit_diff"] > 1e-2, result


def test_compare_weights_flags_the_norm_offset_mistake(tmp_path, hf_dir, capsys):
    good = tmp_path / "good"
    assert hf_to_megatron.main(["--hf", str(hf_dir), "--out", str(good), "--tp", "2"]) == 0
    capsys.readouterr()
    assert compare_weights.main([str(hf_dir), str(good)]) == 0
    assert "all" in capsys.readouterr().out
    # a converter that treats megatron's norm weight as the full scale (1 + w)
    for t in range(2):
        path = shard_path(good, t, 0)
        state = torch.load(path, weights_only=True)
        torch.save({k: (v + 1.0 if "layernorm" in k else v) for k, v in state.items()}, path)
    assert compare_weights.main([str(hf_dir), str(good)]) == 1
    flagged = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if ": " in line]
    hf_names = load_file(str(hf_dir / "model.safetensors"))
    norms = sorted(n for n in hf_names if "norm" in n)
    assert len(norms) == 4 * 4 + 1 and sorted(flagged) == norms


def test_bad_sources_get_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json not found: --hf must be a HF checkpoint directory"):
        hf_to_megatron.main(["--hf", str(tmp_path), "--out", str(tmp_path / "out")])
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="model_type 'llama'; only 'gemma2' converts"):
        hf_to_megatron.main(["--hf", str(tmp_path), "--out", str(tmp_path / "out")])
    with pytest.raises(FileNotFoundError, match="not a checkpoint written by `audiollm convert hf-to-megatron`"):
        megatron_to_hf.main(["--megatron", str(tmp_path), "--out", str(tmp_path / "back")])
