"""A checkpoint that leaves its frozen weights in another (orchestrator/train/dist_format.py
load_model_state) loads when that other is a training run's checkpoint: a LoRA run
started from a pretraining run's step, resumed (it failed: both checkpoints' common state
came back, two optimizer steps for one entry)."""

import json

import torch


def test_frozen_weights_read_from_a_training_runs_checkpoint_come_without_its_common_state(tmp_path):
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from orchestrator.plan.checkpoint_dirs import FROZEN_SOURCE, source_files
    from orchestrator.train.dist_format import load_model_state, process_group

    def sharded(key, value):
        return ShardedTensor.from_rank_offsets(key, torch.full((3,), value), replica_id=0)

    source = tmp_path / "pretrain" / "checkpoints" / "step_000004"
    own = tmp_path / "lora" / "checkpoints" / "step_000002"
    with process_group():
        for path, state in ((source, {"model": {"base": sharded("model.base", 1.0)}, "optimizer": {"step": 4.0}}),
                            (own, {"model": {"lora": sharded("model.lora", 2.0)}, "optimizer": {"step": 2.0}})):
            path.mkdir(parents=True)
            dist_checkpointing.save(state, str(path))
        (own / FROZEN_SOURCE).write_text(json.dumps({"source": str(source), "files": source_files(source),
                                                     "tensors": ["model.base"]}))
        loaded = load_model_state({"model": {"base": sharded("model.base", 0.0), "lora": sharded("model.lora", 0.0)}},
                                  own)
    assert torch.equal(loaded["model"]["base"], torch.full((3,), 1.0))
    assert torch.equal(loaded["model"]["lora"], torch.full((3,), 2.0))
    assert loaded["optimizer"] == {"step": 2.0}  # the checkpoint's own, not its source's
