"""The trainer's tests' model and data: a tiny megatron GPTModel (local spec) under the
name `language_model` (so parameter names follow the AudioLLM contract) and
deterministic synthetic token rows from several named "datasets", implementing the
interfaces of orchestrator/train/components.py. They reach the real trainer through
its plug-in point, the components factory of orchestrator.train.entry:

    torchrun -m tests.train.stand_in RUN_DIR            (entry.main with this factory)
    torchrun -m tests.train.stand_in eval RUN_DIR       (evaluate.evaluate_run with it;
    python -m tests.train.stand_in eval RUN_DIR CKPT     one process: resharded to TP=PP=1)

`poison_sample` makes one synthetic sample's loss NaN (the divergence tests).
"""

from __future__ import annotations

from typing import Optional

import torch

from orchestrator.plan.step_flops import real_tokens

MODEL_NAME = "stand_in_gpt"  # model.name of the plans tests/train/plans.py writes


def _megatron_module():
    from megatron.core.transformer.module import MegatronModule

    return MegatronModule


class StandInGPT(_megatron_module()):
    """language_model = GPTModel (local spec, tied embeddings, RMSNorm, RoPE)."""

    def __init__(self, config, vocab_size: int, seq_length: int, pre_process: bool, post_process: bool,
                 vp_stage: Optional[int]):
        super().__init__(config=config)
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        self.language_model = GPTModel(
            config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=vocab_size,
            max_sequence_length=seq_length, pre_process=pre_process, post_process=post_process,
            share_embeddings_and_output_weights=True, position_embedding_type="rope", vp_stage=vp_stage,
        )
        self.pre_process, self.post_process, self.vp_stage = pre_process, post_process, vp_stage
        # megatron's schedules / finalize_model_grads look for these on the wrapped module.
        from megatron.core.enums import ModelType

        self.model_type = ModelType.encoder_or_decoder
        self.share_embeddings_and_output_weights = True

    def set_input_tensor(self, input_tensor):
        self.language_model.set_input_tensor(input_tensor)

    def shared_embedding_or_output_weight(self):
        return self.language_model.shared_embedding_or_output_weight()

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Optional[dict] = None):
        return self.language_model.sharded_state_dict(prefix + "language_model.", sharded_offsets, metadata)

    def forward(self, tokens, position_ids, attention_mask, labels=None):
        return self.language_model(tokens, position_ids, attention_mask, labels=labels)


class StandInProvider:
    def __init__(self, vocab_size: int, seq_length: int):
        self.vocab_size, self.seq_length = vocab_size, seq_length
        self._mask = torch.triu(torch.ones(seq_length, seq_length, dtype=torch.bool), diagonal=1)[None, None]

    def build(self, config, pre_process, post_process, vp_stage, decisions=None):
        self.config = config  # the loop's config, for flop_counter
        return StandInGPT(config, self.vocab_size, self.seq_length, pre_process, post_process, vp_stage)

    def forward(self, model, batch):
        device = next(iter(p for p in model.parameters())).device
        mask = self._mask.to(device)
        tokens = batch["tokens"].to(device)
        return model(tokens, batch["position_ids"].to(device), mask, labels=batch["labels"].to(device))

    def flop_counter(self, trained: set):
        """Every row counted as a full sample of the stand-in's dense decoder (all of it trains)."""
        per_sample = decoder_flops_per_sample(self.config, self.seq_length, self.vocab_size)

        def count(batch: dict) -> dict:
            rows = batch["tokens"].shape[0]
            return {"model": per_sample["model"] * rows, "hardware": per_sample["hardware"] * rows,
                    "tokens": real_tokens(batch), "slots": batch["tokens"].numel()}
        return count


# FLOPs of the stand-in's decoder-only transformer from its TransformerConfig. Model FLOPs:
# forward + backward = 3 x forward; hardware FLOPs add what activation recomputation
# re-runs: a second forward of every recomputed layer (full) or of the core attention
# (selective). Matmuls only; a multiply-add is 2 FLOPs; attention scores count the full
# s x s square (as Megatron-LM).
def _layer_forward_flops(config, seq_length: int) -> tuple[float, float]:
    """(linear FLOPs, core-attention FLOPs) of one layer's forward, per token."""
    h = config.hidden_size
    kv = config.kv_channels or h // config.num_attention_heads
    q_width = config.num_attention_heads * kv
    kv_width = (config.num_query_groups or config.num_attention_heads) * kv
    ffn = config.ffn_hidden_size
    fc1_out = 2 * ffn if config.gated_linear_unit else ffn
    linear = 2 * (h * (q_width + 2 * kv_width) + q_width * h + h * fc1_out + ffn * h)
    attention = 2 * 2 * seq_length * q_width  # QK^T and attention x V
    return float(linear), float(attention)


def decoder_flops_per_sample(config, seq_length: int, vocab_size: int) -> dict:
    linear, attention = _layer_forward_flops(config, seq_length)
    layers = config.num_layers
    logits = 2.0 * config.hidden_size * vocab_size
    forward = seq_length * (layers * (linear + attention) + logits)
    model = 3.0 * forward
    granularity = getattr(config, "recompute_granularity", None)
    if granularity == "full":
        recomputed_layers = layers if config.recompute_num_layers is None else min(layers, _full_recompute_layers(config))
        extra = seq_length * recomputed_layers * (linear + attention)
    elif granularity == "selective":
        extra = seq_length * layers * attention
    else:
        extra = 0.0
    return {"model": model, "hardware": model + extra}


def _full_recompute_layers(config) -> int:
    # uniform: every layer is recomputed (in chunks of recompute_num_layers);
    # block: the first recompute_num_layers layers of each pipeline stage.
    if config.recompute_method == "block":
        return config.recompute_num_layers * (config.pipeline_model_parallel_size or 1)
    return config.num_layers


class SyntheticBatches:
    """Deterministic token rows: sample i belongs to dataset i % len(names); its row
    counts up from a random start by that dataset's stride (mod vocab), which a tiny
    model learns in a few steps. Sample i is the same whoever draws it, so the stream
    only depends on `consumed_samples` (the saved state) and the DP layout.

    `poison_sample` (tests): that sample's loss_mask is NaN, so its loss is NaN."""

    def __init__(self, vocab_size: int, seq_length: int, micro_batch_size: int, num_microbatches: int,
                 dp_rank: int, dp_size: int, seed: int = 0, names=("synthetic_a", "synthetic_b"),
                 poison_sample: Optional[int] = None):
        self.vocab_size, self.seq_length = vocab_size, seq_length
        self.micro_batch_size, self.num_microbatches = micro_batch_size, num_microbatches
        self.dp_rank, self.dp_size, self.seed = dp_rank, dp_size, seed
        self.dataset_names = list(names)
        self.poison_sample = poison_sample
        self.consumed_samples = 0  # over all DP ranks, at the start of the current step
        self._microbatch_in_step = 0

    def _sample(self, index: int):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        dataset = index % len(self.dataset_names)
        stride = 1 + 2 * dataset
        start = int(torch.randint(0, self.vocab_size, (1,), generator=gen))
        row = (start + stride * torch.arange(self.seq_length + 1)) % self.vocab_size
        return row, dataset

    def next_microbatch(self) -> dict:
        per_rank = self.micro_batch_size * self.num_microbatches
        first = self.consumed_samples + self.dp_rank * per_rank + self._microbatch_in_step * self.micro_batch_size
        rows, datasets = zip(*(self._sample(first + j) for j in range(self.micro_batch_size)))
        rows = torch.stack(rows)
        loss_mask = torch.ones(self.micro_batch_size, self.seq_length)
        if self.poison_sample is not None and first <= self.poison_sample < first + self.micro_batch_size:
            loss_mask[self.poison_sample - first] = float("nan")
        self._microbatch_in_step += 1
        if self._microbatch_in_step == self.num_microbatches:
            self._microbatch_in_step = 0
            self.consumed_samples += per_rank * self.dp_size
        return dict(
            tokens=rows[:, :-1].contiguous(), labels=rows[:, 1:].contiguous(), loss_mask=loss_mask,
            position_ids=torch.arange(self.seq_length)[None].expand(self.micro_batch_size, -1),
            dataset_index=torch.tensor(datasets)[:, None].expand(-1, self.seq_length).contiguous(),
        )

    def state_dict(self) -> dict:
        if self._microbatch_in_step:
            raise RuntimeError("a batch source is saved between optimizer steps only")
        return {"consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict) -> None:
        self.consumed_samples = int(state["consumed_samples"])
        self._microbatch_in_step = 0

    def merge_states(self, states: list) -> dict:
        return states[0]  # consumed_samples counts every data-parallel rank's samples

    def sample_counts(self) -> dict:
        return {}  # synthetic rows: nothing is skipped or truncated


def build_components(plan, dp_rank: int, dp_size: int, poison_sample: Optional[int] = None):
    """The components factory (orchestrator.train.entry.make_trainer) of a stand-in plan."""
    from orchestrator.train.loop import Components

    common = dict(vocab_size=plan.padded_vocab_size, seq_length=plan.seq_length,
                  micro_batch_size=plan.micro_batch_size, num_microbatches=plan.num_microbatches,
                  dp_rank=dp_rank, dp_size=dp_size)
    seed = int(plan.section("data").get("seed", 17))
    return Components(
        provider=StandInProvider(plan.padded_vocab_size, plan.seq_length),
        train_source=SyntheticBatches(seed=seed, poison_sample=poison_sample, **common),
        val_source=SyntheticBatches(seed=seed + 1, **common),
    )


if __name__ == "__main__":
    import sys

    if sys.argv[1] == "eval":  # eval RUN_DIR [CHECKPOINT]; one process when not under torchrun
        from orchestrator.eval.evaluate import evaluate_run

        evaluate_run(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None, components_factory=build_components)
    else:
        from orchestrator.train.entry import main

        sys.exit(main(sys.argv[1], components_factory=build_components))
