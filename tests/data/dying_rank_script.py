"""A training process that dies hard with its data workers busy, for
tests/data/test_loader.py: builds a train loader with 2 workers over the MDS datasets
given, draws one batch (the workers go on reading ahead), prints the workers' pids and
ends with os._exit, as a rank killed by the out-of-memory killer ends: no clean-up.

Run: python tests/data/dying_rank_script.py TOKENIZER_DIR DATASET_DIR..."""

import os
import sys

import psutil
from omegaconf import OmegaConf

from orchestrator.data.loader import build_train_loader
from orchestrator.plan.schema.data import DatasetEntry
from orchestrator.plan.schema.model import AdapterConfig, EncoderConfig
from tests.data.conftest import data_config


def main():
    tokenizer, *datasets = sys.argv[1:]
    cfg = data_config([DatasetEntry(name=f"d{i}", path=path) for i, path in enumerate(datasets)],
                      tokenizer=tokenizer, num_workers=2)
    encoder = OmegaConf.structured(EncoderConfig(d_model=64, num_layers=1, num_heads=2, ffn_dim=64, num_mel_bins=80,
                                                 max_source_positions=250))
    loader = build_train_loader(cfg, encoder, OmegaConf.structured(AdapterConfig(frame_stack=5)),
                                micro_batch_size=2, seed=7)
    next(loader)
    workers = [child.pid for child in psutil.Process().children()
               if "resource_tracker" not in " ".join(child.cmdline())]  # multiprocessing's helper is not one
    print("WORKERS " + " ".join(map(str, workers)), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
