"""LoRA on plain torch linears (encoder and adapter), in one process."""

import pytest
import torch

from orchestrator.train.lora import apply_lora, lora_parameter_names, merge_lora


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = torch.nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self.self_attn, name, torch.nn.Linear(8, 8))
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        a = self.self_attn
        x = x + a.out_proj(a.q_proj(x) * torch.sigmoid(a.k_proj(x)) + a.v_proj(x))
        return x + self.fc2(torch.relu(self.fc1(x)))


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Module()
        self.encoder.layers = torch.nn.ModuleList([_Layer()])
        self.adapter = torch.nn.Module()
        self.adapter.linear_1, self.adapter.linear_2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.adapter.linear_2(torch.nn.functional.silu(self.adapter.linear_1(self.encoder.layers[0](x))))


def test_encoder_and_adapter_lora_names_freeze_and_merge():
    torch.manual_seed(0)
    model = _Model()
    x = torch.randn(3, 8)
    base = model(x).detach()
    names = apply_lora(model, {"rank": 2, "alpha": 4, "targets": [], "encoder": True, "adapter": True}, seed=1, b_std=0.1)
    assert sorted(names) == sorted(
        [f"encoder.layers.0.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj", "out_proj")]
        + ["encoder.layers.0.fc1", "encoder.layers.0.fc2", "adapter.linear_1", "adapter.linear_2"]
    )
    params = dict(model.named_parameters())
    assert params["adapter.linear_1.lora_a.weight"].shape == (2, 8)
    assert params["adapter.linear_1.lora_b.weight"].shape == (8, 2)
    assert not params["adapter.linear_1.weight"].requires_grad and not params["adapter.linear_1.bias"].requires_grad
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == sorted(lora_parameter_names(model)) and len(trainable) == 16
    adapted = model(x).detach()
    assert (adapted - base).abs().max() > 1e-3
    # the reference from LoRA's definition: a copy of the model with W + (alpha/r) B A
    reference = _Model()
    state = {n: p for n, p in model.state_dict().items() if "lora_" not in n}
    for name in names:
        b, a = params[f"{name}.lora_b.weight"], params[f"{name}.lora_a.weight"]
        state[f"{name}.weight"] = state[f"{name}.weight"] + (4 / 2) * b.detach() @ a.detach()
    reference.load_state_dict(state)
    assert torch.allclose(reference(x), adapted, atol=1e-6)
    assert merge_lora(model) == 8 and lora_parameter_names(model) == []
    assert torch.allclose(model(x), adapted, atol=1e-6)
    assert "adapter.linear_1.weight" in dict(model.named_parameters())


class _TELikeLinear(torch.nn.Module):
    """Stand-in for a TransformerEngine linear (TE cannot be imported without CUDA): what
    LoRA relies on of megatron's TEColumn/TERowParallelLinear - `parallel_mode`, the
    weight [out, in], megatron's TP group in `_tp_group` (TE's `tp_group` None at TP=1),
    `sequence_parallel`, and a forward returning (output, bias)."""

    def __init__(self, in_features, out_features, parallel_mode):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features))
        self.parallel_mode, self.sequence_parallel = parallel_mode, False
        self.tp_group, self._tp_group = None, torch.distributed.group.WORLD

    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight), None


def test_lora_adapts_transformer_engine_like_linears_te_stand_in(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        block = torch.nn.Module()
        block.linear_qkv = _TELikeLinear(8, 12, "column")
        block.linear_proj = _TELikeLinear(12, 8, "row")
        block.norm = _TELikeLinear(8, 8, None)  # TE's "duplicated" linear: not a split linear
        x = torch.randn(5, 8)
        names = apply_lora(block, {"rank": 2, "alpha": 8, "targets": ["linear_qkv", "linear_proj"]}, seed=3, b_std=0.1)
        assert names == ["linear_qkv", "linear_proj"]
        for name in names:
            layer = getattr(block, name)
            assert layer._lora_column == (name == "linear_qkv")
            assert not layer.weight.requires_grad and layer.lora_a.weight.requires_grad
            out, bias = layer(x if name == "linear_qkv" else torch.randn(5, 12))
            assert bias is None
        # W x + (alpha/r) B A x, from LoRA's definition. fp32 sums of <= 12 terms of size ~1:
        # rounding ~12 * 2**-24 * 3 ~ 2e-6; the bound leaves 5x.
        layer = block.linear_qkv
        expected = x @ (layer.weight + 4.0 * layer.lora_b.weight @ layer.lora_a.weight).T
        torch.testing.assert_close(layer(x)[0], expected, atol=1e-5, rtol=1e-5)
        with pytest.raises(TypeError, match=r"_TELikeLinear is none of them \(parallel_mode None\)"):
            apply_lora(block, {"rank": 2, "targets": ["norm"]}, seed=3)
        assert merge_lora(block) == 2
        torch.testing.assert_close(block.linear_qkv(x)[0], expected, atol=1e-5, rtol=1e-5)
        assert type(block.linear_qkv) is _TELikeLinear
    finally:
        torch.distributed.destroy_process_group()
