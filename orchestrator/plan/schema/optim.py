"""`optim` group: optimizer, schedule and batch sizes."""

from dataclasses import dataclass


@dataclass
class OptimConfig:
    optimizer: str = "adam"  # megatron's Adam with decoupled weight decay (AdamW)
    lr: float = 1e-4  # peak learning rate; lr groups scale it (lora.lr_groups)
    min_lr: float = 0.0  # floor of the cosine decay
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0  # global grad-norm clip; 0 disables
    lr_warmup_iters: int = 0
    lr_decay_style: str = "cosine"  # cosine | linear | constant
    global_batch_size: int = 64  # samples (packed rows) per optimizer step, over all DP ranks
    micro_batch_size: int = 1  # samples per forward pass per DP rank
