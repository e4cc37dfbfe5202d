"""lora.lr_groups -> a partition of the trainable parameters (in one process)."""

import pytest
import torch

from orchestrator.train.lr_groups import LrGroupError, apply_lr_groups, assign_groups, parse_groups

NAMES = [
    "encoder.conv1.weight",
    "adapter.linear_1.weight",
    "language_model.decoder.layers.0.self_attention.linear_qkv.weight",
    "language_model.decoder.layers.0.self_attention.linear_qkv.lora_a.weight",
    "language_model.decoder.layers.0.self_attention.linear_qkv.lora_b.weight",
]


def test_first_matching_group_wins():
    groups = parse_groups([
        {"name": "lora", "patterns": ["*lora_*"], "lr_scale": 1.0},
        {"name": "encoder", "patterns": ["encoder.*"], "lr_scale": 0.1},
        {"name": "everything", "patterns": ["*"], "lr_scale": 0.5},
    ])
    assignment = assign_groups(NAMES, groups)
    assert {n: g.name for n, g in assignment.items()} == {
        NAMES[0]: "encoder", NAMES[1]: "everything", NAMES[2]: "everything", NAMES[3]: "lora", NAMES[4]: "lora",
    }


def test_unmatched_trainable_parameter_is_an_error_naming_it():
    groups = parse_groups([{"name": "lora", "patterns": ["*lora_*"], "lr_scale": 1.0}])
    with pytest.raises(LrGroupError) as err:
        assign_groups(NAMES, groups)
    assert "encoder.conv1.weight" in str(err.value) and "adapter.linear_1.weight" in str(err.value)
    assert "3 trainable parameter(s)" in str(err.value)


def test_bad_group_definitions():
    with pytest.raises(LrGroupError, match="duplicate group names"):
        parse_groups([{"name": "a", "patterns": ["*"]}, {"name": "a", "patterns": ["x"]}])
    with pytest.raises(LrGroupError, match="lr_scale must be >= 0"):
        parse_groups([{"name": "a", "patterns": ["*"], "lr_scale": -1}])


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(2, 2)
        self.adapter = torch.nn.Linear(2, 2)


def test_lr_scale_zero_freezes_and_the_rest_get_scaled_overrides():
    model = _Model()
    overrides, members, scales = apply_lr_groups(
        [model],
        [{"name": "encoder", "patterns": ["encoder.*"], "lr_scale": 0.0},
         {"name": "adapter", "patterns": ["adapter.*"], "lr_scale": 0.5}],
        lr=1e-3, min_lr=1e-4,
    )
    assert not model.encoder.weight.requires_grad and not model.encoder.bias.requires_grad
    assert model.adapter.weight.requires_grad
    assert members == {"encoder": ["encoder.weight", "encoder.bias"], "adapter": ["adapter.weight", "adapter.bias"]}
    (value,) = overrides.values()
    assert value == {"max_lr": 5e-4, "min_lr": 5e-5, "lr_mult": 0.5}
    assert scales == {"encoder": 0.0, "adapter": 0.5}
    (key,) = overrides
    assert key.matches(model.adapter.weight, "adapter.weight") and not key.matches(model.encoder.weight, "x")


def test_groups_with_equal_scales_share_one_optimizer_group():
    model = _Model()
    overrides, _, scales = apply_lr_groups(
        [model],
        [{"name": "encoder", "patterns": ["encoder.*"], "lr_scale": 0.1},
         {"name": "adapter", "patterns": ["adapter.*"], "lr_scale": 0.1}],
        lr=1e-3, min_lr=0.0,
    )
    # megatron matches saved optimizer groups by (wd_mult, lr_mult, ...): one entry per scale
    assert [v["lr_mult"] for v in overrides.values()] == [0.1]
    assert scales == {"encoder": 0.1, "adapter": 0.1}
