"""Each torchrun rank builds the train and validation loaders as data-parallel rank = its rank,
reads one epoch of its share recording the sample ids it reads, and checks that a loader
resumed from a mid-stream state (samples in flight in the workers) gives the same batches.

    torchrun --nproc_per_node=2 tests/data/dp_loader_script.py CONFIG.json OUT_DIR
"""

import json
import os
import sys

import torch.distributed as dist
from omegaconf import OmegaConf

from orchestrator.data.loader import build_train_loader, build_validation_loaders
from orchestrator.plan.schema.data import DataConfig
from orchestrator.plan.schema.model import AdapterConfig, EncoderConfig
from tests.data.test_loader import record_reads


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    out_dir = sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = OmegaConf.merge(OmegaConf.structured(DataConfig), spec["data"])
    enc = OmegaConf.structured(EncoderConfig(d_model=8, num_layers=1, num_heads=1, ffn_dim=8, num_mel_bins=80,
                                             max_source_positions=250))
    ada = OmegaConf.structured(AdapterConfig(frame_stack=5))

    def loader():
        return build_train_loader(data, enc, ada, micro_batch_size=1, dp_rank=rank, dp_size=world, seed=spec["seed"])

    reading = loader()
    record_reads(reading, os.path.join(out_dir, f"reads{rank}"))
    per_epoch = reading.order.per_epoch
    for _ in range(per_epoch):
        next(reading)
    reading.close()

    first = loader()
    for _ in range(spec["resume_at"]):
        next(first)
    state = first.state_dict()
    continued = [next(first)["tokens"][0].tolist() for _ in range(spec["after"])]
    first.close()
    resumed = loader()
    resumed.load_state_dict(state)
    again = [next(resumed)["tokens"][0].tolist() for _ in range(spec["after"])]
    resumed.close()

    val = {name: [t for b in vs for t in b["transcripts"]]
           for name, vs in build_validation_loaders(data, enc, ada, 2, dp_rank=rank, dp_size=world).items()}
    # Mosaic must have left the real distributed environment as it found it.
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (str(rank), str(world))
    ids = reading.order.epoch_ids(0).tolist() + reading.order.epoch_ids(1).tolist()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"per_epoch": per_epoch, "epoch_ids": ids, "continued": continued, "resumed": again, "val": val}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
