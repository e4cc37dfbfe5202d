"""The decoder's LoRA <-> PEFT adapters (orchestrator/convert/peft_lora.py), tensors only:
adapters written by the `peft` package itself on a tiny HF Gemma2, the update B A each
HF linear gets, both directions."""

from __future__ import annotations

import pytest
import torch

from orchestrator.convert.decoder_mapping import DecoderShape, megatron_tensor_to_hf
from orchestrator.convert.peft_lora import (PARTS, megatron_lora_to_peft, peft_to_megatron_lora, read_peft_adapter,
                                            write_peft_adapter)
from orchestrator.convert.peft_lora import _row_blocks
from tests.models.tiny_models import HF_DECODERS, hf_gemma2

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_adapter(tmp_path, targets, rank=4, alpha=8.0, seed=0):
    """A PEFT LoRA adapter made by `peft` on the tiny Gemma2, B drawn non-zero, saved."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(hf_gemma2(seed=seed), LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    model.save_pretrained(tmp_path / "adapter")
    shape = DecoderShape.from_hf_config(model.base_model.model.config)
    return tmp_path / "adapter", shape, model


def _hf_updates(tensors, config):
    """{'layers.i.<module>': scaling * B A} of a PEFT adapter's tensors."""
    scaling = float(config["lora_alpha"]) / int(config["r"])
    out = {}
    for name, a in tensors.items():
        if ".lora_A." in name:
            key = name.split("base_model.model.model.")[1].split(".lora_A.")[0]
            out[key] = scaling * tensors[name.replace(".lora_A.", ".lora_B.")].double() @ a.double()
    return out


def _megatron_updates(lora, rank, alpha, shape):
    """The same, from the fused megatron factors split back into HF linears' rows."""
    out = {}
    for name, a in lora.items():
        if name.endswith(".lora_a.weight"):
            layer = name.split(".")[2]
            linear = ".".join(name.split(".")[3:5])
            delta = (alpha / rank) * lora[name.replace(".lora_a.", ".lora_b.")].double() @ a.double()
            for part, rows in zip(PARTS[linear], _row_blocks(linear, delta, shape)):
                out[f"layers.{layer}.{part}"] = rows
    return out


def test_an_adapter_made_by_peft_imports_as_the_same_update_and_exports_back(tmp_path):
    """Its own A per q/k/v and per gate/up: the fused factors stack them (rank 4 x 3 on
    qkv, every linear padded to 12, alpha scaled to keep alpha / rank); each HF linear's
    update is PEFT's. Exported again, PEFT's files hold rank 12 and the same updates."""
    adapter, shape, _ = _peft_adapter(tmp_path, MODULES)
    tensors, config = read_peft_adapter(adapter)
    lora, rank, alpha = peft_to_megatron_lora(tensors, config, shape)
    assert (rank, alpha) == (12, 8.0 * 12 / 4)
    assert lora["decoder.layers.0.self_attention.linear_qkv.lora_a.weight"].shape == (12, shape.hidden_size)
    want = _hf_updates(tensors, config)
    got = _megatron_updates(lora, rank, alpha, shape)
    assert sorted(got) == sorted(want) and len(want) == shape.num_layers * 7
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-12, msg=key)
    back, back_config = megatron_lora_to_peft(lora, shape, rank, alpha)
    write_peft_adapter(tmp_path / "again", back, back_config)
    tensors2, config2 = read_peft_adapter(tmp_path / "again")
    assert (config2["r"], config2["lora_alpha"], config2["target_modules"]) == (12, 24.0, sorted(MODULES))
    again = _hf_updates(tensors2, config2)
    for key in want:
        torch.testing.assert_close(again[key], want[key], rtol=0, atol=1e-12, msg=key)


def test_an_adapter_on_some_parts_only_leaves_the_others_unchanged(tmp_path):
    """q_proj and v_proj only (a common PEFT choice): linear_qkv's factors give k_proj no
    update; no MLP factors at all."""
    adapter, shape, _ = _peft_adapter(tmp_path, ["q_proj", "v_proj"])
    tensors, config = read_peft_adapter(adapter)
    lora, rank, alpha = peft_to_megatron_lora(tensors, config, shape)
    assert rank == 8 and not [n for n in lora if "mlp" in n or "linear_proj" in n]
    got, want = _megatron_updates(lora, rank, alpha, shape), _hf_updates(tensors, config)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-12, msg=key)
    assert all(float(got[k].abs().max()) == 0.0 for k in got if k.endswith("k_proj"))


def test_the_projects_own_adapter_round_trips_at_its_rank():
    """Factors with one A per fused linear (what training makes) -> PEFT -> back: the same
    tensors at the same rank and alpha."""
    shape = DecoderShape(num_layers=2, hidden_size=16, num_heads=4, num_kv_heads=2, head_dim=4, ffn_hidden_size=24,
                        vocab_size=50)
    gen = torch.Generator().manual_seed(0)
    outs = {"self_attention.linear_qkv": (4 + 2 * 2) * 4, "self_attention.linear_proj": 16, "mlp.linear_fc1": 48,
            "mlp.linear_fc2": 16}
    ins = {"self_attention.linear_qkv": 16, "self_attention.linear_proj": 16, "mlp.linear_fc1": 16, "mlp.linear_fc2": 24}
    lora = {}
    for layer in range(2):
        for linear, out in outs.items():
            lora[f"decoder.layers.{layer}.{linear}.lora_a.weight"] = torch.randn(3, ins[linear], generator=gen)
            lora[f"decoder.layers.{layer}.{linear}.lora_b.weight"] = torch.randn(out, 3, generator=gen)
    tensors, config = megatron_lora_to_peft(lora, shape, 3, 6.0)
    back, rank, alpha = peft_to_megatron_lora(tensors, config, shape)
    assert (rank, alpha) == (3, 6.0) and sorted(back) == sorted(lora)
    assert all(torch.equal(back[n], lora[n]) for n in lora)


@pytest.mark.parametrize("extra, message", [({"use_dora": True}, "use_dora is set"),
                                            ({"rank_pattern": {"q_proj": 8}}, "rank_pattern gives modules"),
                                            ({"peft_type": "IA3"}, "peft_type is 'IA3'")])
def test_adapters_that_are_not_plain_lora_are_refused(tmp_path, extra, message):
    adapter, shape, _ = _peft_adapter(tmp_path, ["q_proj"])
    tensors, config = read_peft_adapter(adapter)
    with pytest.raises(ValueError, match=message):
        peft_to_megatron_lora(tensors, {**config, **extra}, shape)


@pytest.mark.parametrize("family", ["gemma2", *HF_DECODERS])
def test_the_projects_adapter_loaded_by_peft_is_the_merged_model_in_each_family(tmp_path, family):
    """Fused factors as training makes them (one A per megatron linear) -> PEFT adapter ->
    PeftModel.from_pretrained on the family's HF model: its logits are those of the HF
    model whose weights got each fused linear's update (alpha / r) B A, split into HF's
    linears by the weight export's mapping. Each family's q/k/v rows (Qwen3's head_dim
    wider than hidden / heads, Qwen2's biases beside) and module names."""
    from peft import PeftModel

    from orchestrator.convert.peft_lora import _part_out_sizes

    make = {"gemma2": hf_gemma2, **HF_DECODERS}[family]
    base = make(seed=0)
    shape = DecoderShape.from_hf_config(base.config)
    ins = {"self_attention.linear_qkv": shape.hidden_size, "self_attention.linear_proj": shape.num_heads * shape.head_dim,
           "mlp.linear_fc1": shape.hidden_size, "mlp.linear_fc2": shape.ffn_hidden_size}
    gen = torch.Generator().manual_seed(1)
    lora = {}
    for layer in range(shape.num_layers):
        for linear in PARTS:
            rows = sum(_part_out_sizes(linear, shape))
            lora[f"decoder.layers.{layer}.{linear}.lora_a.weight"] = torch.randn(3, ins[linear], generator=gen) * 0.1
            lora[f"decoder.layers.{layer}.{linear}.lora_b.weight"] = torch.randn(rows, 3, generator=gen) * 0.1
    tensors, config = megatron_lora_to_peft(lora, shape, 3, 6.0)
    write_peft_adapter(tmp_path / "adapter", tensors, config)
    adapted = PeftModel.from_pretrained(make(seed=0), tmp_path / "adapter").eval()
    merged = make(seed=0).eval()
    with torch.no_grad():
        for layer in range(shape.num_layers):  # split as the export splits weights, not as peft_lora does
            for linear in PARTS:
                a, b = (lora[f"decoder.layers.{layer}.{linear}.lora_{x}.weight"] for x in "ab")
                for name, delta in megatron_tensor_to_hf(f"decoder.layers.{layer}.{linear}.weight", 2.0 * b @ a, shape):
                    merged.get_parameter(name).add_(delta)
        tokens = torch.randint(1, shape.vocab_size, (2, 12), generator=gen)
        want, got, plain = (m(tokens).logits for m in (merged, adapted, base.eval()))
    # fp32: the update added to the weight vs computed beside it, over logits of a few units
    bound = 1e-4 * max(1.0, float(want.abs().max()))
    assert float((got - want).abs().max()) <= bound
    assert float((plain - want).abs().max()) > 100 * bound  # the adapter does change the model
