"""`lora` group: low-rank adapters and per-module learning rates."""

from dataclasses import dataclass, field
from typing import List


@dataclass
class LrGroup:
    """A learning-rate group: parameters whose full name matches one of `patterns`
    (fnmatch syntax, for example `encoder.*` or `*.lora_*`). Groups are tried in
    order and a parameter belongs to the first group it matches. lr = optim.lr *
    lr_scale; lr_scale 0 freezes the group (its parameters get requires_grad=False,
    never the default rate)."""

    name: str = "default"
    patterns: List[str] = field(default_factory=lambda: ["*"])
    lr_scale: float = 1.0


@dataclass
class LoraConfig:
    rank: int = 0  # 0 disables LoRA
    alpha: float = 16.0  # scaling = alpha / rank
    dropout: float = 0.0
    # Decoder linear layers that get adapters (megatron-core module names).
    targets: List[str] = field(
        default_factory=lambda: ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
    )
    encoder: bool = False  # also adapt the Whisper encoder's attention and MLP linears
    adapter: bool = False  # also adapt the adapter's two linears
    # Every trainable parameter must fall in exactly one group; a parameter matched by
    # no group is an error (no silent fallback to a default rate).
    lr_groups: List[LrGroup] = field(default_factory=lambda: [LrGroup()])
