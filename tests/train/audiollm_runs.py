"""Run directories for training the real AudioLLM on a tiny MDS corpus made here:
tone clips with digit-word transcripts (tests/data/conftest.py), a tokenizer built
from those words, and the tiny_cpu recipe's model resolved by the real planner."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from tests.data.conftest import WORDS, tone_samples, write_mds

TRAIN_SAMPLES = 48
VAL_SAMPLES = 8
TRAIN_SETS = ("tones_a", "tones_b")
VAL_SET = "tones_val"


def make_corpus(root: Path) -> Path:
    """tokenizer/, train/tones_a, train/tones_b, val/tones_val under `root`."""
    from orchestrator.data.tokenizer_build import build_tokenizer
    from orchestrator.plan.schema.data import DataConfig

    root = Path(root)
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 5
    texts += [DataConfig().prompt_template.replace("<SpeechHere>", " ")] * 5
    build_tokenizer(texts, root / "tokenizer", vocab_size=320)
    write_mds(root / "train" / "tones_a", tone_samples(TRAIN_SAMPLES // 2, seed=1))
    write_mds(root / "train" / "tones_b", tone_samples(TRAIN_SAMPLES // 2, seed=2, tag="the"))
    write_mds(root / "val" / "tones_val", tone_samples(VAL_SAMPLES, seed=9))
    return root


_SHARED: list[Path] = []


def shared_corpus() -> Path:
    """make_corpus's corpus, made once per test process (removed when it ends), for tests
    whose runs need data of the recipe's kind but not the demo corpus: the recipe's
    default writes its 5100 espeak-ng utterances (about a minute) into the checkout's
    outputs/, and two test workers would write it at once."""
    if not _SHARED:
        root = Path(tempfile.mkdtemp(prefix="audiollm-tests-corpus-"))
        atexit.register(shutil.rmtree, root, True)
        _SHARED.append(make_corpus(root))
    return _SHARED[0]


def data_overrides(corpus: Path) -> list[str]:
    """The data keys that point a run at make_corpus's datasets instead of the demo corpus."""
    corpus = Path(corpus)
    train = ",".join(f"{{name:{name},path:'{corpus / 'train' / name}'}}" for name in TRAIN_SETS)
    return ["data.demo_corpus=null", f"data.tokenizer='{corpus / 'tokenizer'}'", f"data.train=[{train}]",
            f"data.validation=[{{name:{VAL_SET},path:'{corpus / 'val' / VAL_SET}'}}]"]


# What a run logs to W&B (offline) is tested where it matters (tests/train/test_logging.py,
# test_training.py, and the SLURM runs: one W&B run across a requeue, an evaluation job's
# scores, a cancel that ends W&B's service). Elsewhere the tests' runs log nowhere: W&B
# costs a run about 3 s of CPU (wandb's import and its service), over a minute of the suite.
NO_WANDB = "logger=none"


# The tiny AudioLLM with a Llama decoder of the same shape (orchestrator/plan/decoder_families.py):
# Llama 3's RoPE base and scaling, its own output layer.
LLAMA_DECODER = ["model.decoder.family=llama", "model.decoder.sliding_window=null",
                 "model.decoder.query_pre_attn_scalar=null", "model.decoder.attn_logit_softcap=null",
                 "model.decoder.final_logit_softcap=null", "model.decoder.rope_theta=500000",
                 "model.decoder.rope_scaling_factor=8", "model.decoder.tie_embeddings=false"]


def train_overrides(corpus: Path, wandb: bool = False) -> list[str]:
    """`audiollm train` overrides for the tiny AudioLLM on make_corpus's datasets (not the
    demo corpus), with the small batch and sequence sizes of write_audiollm_run_dir: the
    real trainer at a fraction of a second per step on CPU; W&B (offline) only if `wandb`."""
    return [
        *data_overrides(corpus), "optim.micro_batch_size=2", "optim.global_batch_size=4", "optim.lr=3e-3", "optim.min_lr=3e-4",
        "optim.lr_warmup_iters=2", "data.seq_length=128", "data.packing_buffer=8", "data.feature_cache_mb=64",
        "model.adapter.dropout=0.0", "train.eval_iters=1", "train.log_interval=1", *([] if wandb else [NO_WANDB]),
    ]


def write_audiollm_run_dir(run_dir: Path, corpus: Path, *, tp: int = 1, pp: int = 1, cp: int = 1, iters: int = 12,
                           micro_batch_size: int = 2, global_batch_size: int = 4, seq_length: int = 128,
                           save_interval: int = 0, eval_interval: int = 0, extra: Sequence[str] = ()) -> Path:
    """Compose (tiny_cpu recipe + overrides) -> validate -> resolve -> plan.json, as
    `audiollm train` writes it (W&B off unless `extra` says otherwise: NO_WANDB)."""
    from omegaconf import OmegaConf

    from orchestrator.plan.compose import compose
    from orchestrator.plan.resolve import resolve
    from orchestrator.plan.schema.data import DatasetEntry

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = compose([
        f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.cp={cp}", f"launcher.gpus_per_node={tp * pp * cp}",
        f"optim.micro_batch_size={micro_batch_size}", f"optim.global_batch_size={global_batch_size}",
        "optim.lr=3e-3", "optim.min_lr=3e-4", "optim.lr_warmup_iters=2",
        f"train.iters={iters}", f"train.save_interval={save_interval}", f"train.eval_interval={eval_interval}",
        "train.eval_iters=1", "train.log_interval=1",
        f"data.seq_length={seq_length}", "data.packing_buffer=8", "data.feature_cache_mb=64",
        f"data.tokenizer={corpus / 'tokenizer'}", "model.adapter.dropout=0.0",
        f"run.name={run_dir.name}", f"run.output_root={run_dir.parent}", NO_WANDB, *extra,
    ])
    cfg.data.train = [DatasetEntry(name=name, path=str(corpus / "train" / name)) for name in TRAIN_SETS]
    cfg.data.validation = [DatasetEntry(name=VAL_SET, path=str(corpus / "val" / VAL_SET))]
    plan = resolve(cfg).to_dict()
    (run_dir / "plan.json").write_text(json.dumps(plan, indent=1))
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    return run_dir


def audiollm_cli(argv: Sequence[str], cwd: Path, timeout: float = 600, env: dict | None = None):
    """`audiollm ARGV...` as a user types it, in a process of its own; the completed process
    (stdout and stderr together in `.stdout`)."""
    import os
    import subprocess
    import sys

    from tests.distributed_run import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=cwd, env=env)
