"""Each torchrun rank builds the train and validation loaders as data-parallel rank = its rank.

    torchrun --nproc_per_node=2 tests/data/dp_loader_script.py CONFIG.json OUT_DIR
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from orchestrator.data.loader import build_train_loader, build_validation_loaders
from orchestrator.schema.data import DataConfig
from orchestrator.schema.model import AdapterConfig, EncoderConfig


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    out_dir = sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    data = OmegaConf.merge(OmegaConf.structured(DataConfig), spec["data"])
    enc = OmegaConf.structured(EncoderConfig(d_model=8, num_layers=1, num_heads=1, ffn_dim=8, num_mel_bins=80,
                                             max_source_positions=250))
    ada = OmegaConf.structured(AdapterConfig(frame_stack=5))
    loader = build_train_loader(data, enc, ada, micro_batch_size=1, dp_rank=rank, dp_size=world, seed=spec["seed"])
    train = [next(loader)["tokens"][0].tolist() for _ in range(spec["batches"])]
    val = {name: [t for b in vs for t in b["transcripts"]]
           for name, vs in build_validation_loaders(data, enc, ada, 2, dp_rank=rank, dp_size=world).items()}
    # Mosaic must have left the real distributed environment as it found it.
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == (str(rank), str(world))
    total = torch.tensor([len(train)])
    dist.all_reduce(total)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"train": train, "val": val, "total": int(total)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
