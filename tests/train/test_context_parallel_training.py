"""Training the real AudioLLM at context-parallel size 2 (the job entry's components, the
MDS loader, megatron's schedules, DDP and optimizer over gloo), against the same run at
CP=1: every step's loss, the validation loss and an exact resume.

The runs keep the tiny_cpu recipe's training-time randomness on (SpecAugment, adapter
dropout 0.1, the auxiliary CTC loss) and pack several samples per row. Bound: 1e-5 per
step (fp32). CP changes no sum in the forward (tests/models/test_context_parallel.py);
the backward adds the CP ranks' gradients of shared weights (encoder, embeddings, all
of them for tokens on two ranks) in another order, a relative 1e-7 per step on losses of
~5 that grows with training: 10 steps measured 2.3e-7 at most."""

from __future__ import annotations

import pytest

from tests.train.audiollm_runs import make_corpus, write_audiollm_run_dir
from tests.train.jobs import launch, metrics, result

ITERS = 10
SAVE_AT = 5
BOUND = 1e-5
RANDOMNESS = ["data.packing=true", "model.adapter.dropout=0.1",  # SpecAugment and CTC: tiny_cpu's own
              # Clips over 1 s (about 40 % of the corpus) cut into 1-s windows: the CTC loss of
              # such a recording runs over all its windows, which may sit on either CP rank.
              "data.long_audio=chunk", "data.max_audio_seconds=1.0"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("cp_corpus"))


def _train(root, corpus, name, nproc, **layout) -> dict:
    extra = [*RANDOMNESS, *layout.pop("extra", [])]
    run_dir = write_audiollm_run_dir(root / name, corpus, iters=ITERS, save_interval=SAVE_AT, extra=extra, **layout)
    return {"dir": run_dir, **result(launch("job_script.py", nproc, "train", str(run_dir), log_dir=root))}


def _differences(a: list, b: list) -> list:
    return [abs(x - y) for x, y in zip(a, b)]


@pytest.fixture(scope="module")
def cp1_and_cp2(corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("cp_runs")
    return _train(root, corpus, "cp1", 1), _train(root, corpus, "cp2", 2, cp=2)


@pytest.mark.multiprocess
def test_cp2_trains_as_cp1(cp1_and_cp2):
    """10 steps at CP=2 (2 processes) give CP=1's loss at every step, and the same
    validation loss; CP ranks hold the same bits of every weight."""
    cp1, cp2 = cp1_and_cp2
    assert len(cp1["losses"]) == len(cp2["losses"]) == ITERS
    assert cp1["losses"][-1] < 0.6 * cp1["losses"][0], cp1["losses"]  # it trains
    diffs = _differences(cp1["losses"], cp2["losses"])
    print("measured: CP=2 vs CP=1 loss differences per step", diffs)
    assert max(diffs) <= BOUND, list(zip(cp1["losses"], cp2["losses"]))
    assert cp2["eval"]["val_loss"] == pytest.approx(cp1["eval"]["val_loss"], abs=BOUND)
    rank0, rank1 = (r["digests"] for r in cp2["ranks"])
    assert rank0 == rank1  # gradients reduced over the data x context parallel ranks
    # The CP run's logged token counts are the whole micro-batches', as at CP=1.
    assert [m["tokens/utilization"] for m in metrics(cp2["dir"])] == [m["tokens/utilization"]
                                                                      for m in metrics(cp1["dir"])]


@pytest.mark.multiprocess
def test_cp2_resumes_exactly(corpus, cp1_and_cp2, tmp_path):
    """CP=2: a hard exit after step 5's checkpoint, then 5 resumed steps give the straight
    CP=2 run's losses bit for bit (weights, optimizer, loader position and packer buffer)."""
    _, straight = cp1_and_cp2
    run_dir = write_audiollm_run_dir(tmp_path / "cp2_resumed", corpus, cp=2, iters=ITERS, save_interval=SAVE_AT,
                                     extra=RANDOMNESS)
    launch("job_script.py", 2, "kill", str(run_dir), str(SAVE_AT), log_dir=tmp_path, expect_rc=17)
    assert [m["step"] for m in metrics(run_dir)] == list(range(1, SAVE_AT + 1))
    resumed = result(launch("job_script.py", 2, "train", str(run_dir), log_dir=tmp_path))
    assert resumed["losses"] == straight["losses"][SAVE_AT:]
    assert [m["loss"] for m in metrics(run_dir)] == straight["losses"]


LORA = ["lora=decoder_r16", "lora.rank=4", "lora.alpha=8",
        "lora.lr_groups=[{name: lora, patterns: ['*lora_*'], lr_scale: 1.0}, {name: rest, patterns: ['*'], lr_scale: 0.5}]"]
COMPOSED = ["parallel.sp=true", "parallel.distributed_optimizer=true", "parallel.recompute.granularity=full",
            "parallel.recompute.method=uniform", "parallel.recompute.num_layers=1", *LORA]


@pytest.mark.multiprocess
def test_cp2_with_tp2_sequence_parallel_distributed_optimizer_recompute_and_lora(corpus, cp1_and_cp2, tmp_path):
    """CP=2 x TP=2 with sequence parallel, the distributed optimizer (sharded over the
    data x context parallel ranks), full recompute and LoRA (4 processes) trains as TP=2
    with the same settings (2 processes). LoRA adapts the CP=1 run's final weights (its
    checkpoint as model.init_checkpoint, resharded to TP=2). The CP run computes its log-mel
    in the step from the waveforms its replica's reader sends (data.features_on=device), each
    CP rank for its own clips: features equal to the loader's within 1e-6
    (tests/data/test_features.py), far inside the bound."""
    from orchestrator.train.checkpoint import latest_checkpoint

    composed = [*COMPOSED, f"model.init_checkpoint={latest_checkpoint(cp1_and_cp2[0]['dir'])}"]
    tp2 = _train(tmp_path, corpus, "tp2", 2, tp=2, extra=composed)
    cp2 = _train(tmp_path, corpus, "tp2cp2", 4, tp=2, cp=2, extra=[*composed, "data.features_on=device"])
    diffs = _differences(tp2["losses"], cp2["losses"])
    print("measured: CP=2 x TP=2 vs TP=2 loss differences per step", diffs)
    assert len(diffs) == ITERS and max(diffs) <= BOUND, list(zip(tp2["losses"], cp2["losses"]))
    lora = [n for n, c in cp2["ranks"][0]["changes"].items() if ".lora_" in n and c > 0]
    assert lora, "LoRA weights did not train"


@pytest.mark.multiprocess
def test_cp2_with_pp2_and_virtual_stages(corpus, tmp_path):
    """CP=2 x PP=2 with 2 virtual stages per rank (4 processes; the interleaved schedule
    sends [S/CP, B, hidden] between stages) trains as PP=2 with 2 virtual stages (2
    processes). The auxiliary CTC loss needs pp = 1."""
    extra = ["parallel.vpp=2", "model.adapter.ctc_weight=0"]
    pp2 = _train(tmp_path, corpus, "pp2", 2, pp=2, extra=extra)
    cp2 = _train(tmp_path, corpus, "pp2cp2", 4, pp=2, cp=2, extra=extra)
    diffs = _differences(pp2["losses"], cp2["losses"])
    print("measured: CP=2 x PP=2 vs PP=2 loss differences per step", diffs)
    assert len(diffs) == ITERS and max(diffs) <= BOUND, list(zip(pp2["losses"], cp2["losses"]))
