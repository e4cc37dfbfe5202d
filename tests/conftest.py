"""Suite-wide set-up."""

import json

import pytest


@pytest.fixture(autouse=True, scope="session")
def tests_importable_in_jobs():
    """Jobs that the launchers start (local processes, SLURM tasks) import test-only
    entries and components (tests.launchers.minimal_job, tests.train.stand_in): the
    repository root goes on their PYTHONPATH, which they inherit."""
    import os
    from pathlib import Path

    repo = str(Path(__file__).resolve().parent.parent)
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (repo, previous) if p)
    yield
    if previous is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = previous


@pytest.fixture(autouse=True, scope="session")
def pretrained_checkpoint_location(tmp_path_factory):
    """The 9B recipes name their pretrained weights through $AUDIOLLM_INIT_CHECKPOINT, and
    plan refuses a path that is not a checkpoint. Planning tests get a directory that
    carries dist_checkpointing's marker file (all the submit side reads); loading real
    weights is tested with real converted checkpoints (tests/train/test_init_checkpoint.py)."""
    import os

    path = tmp_path_factory.mktemp("pretrained_marker")
    (path / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1,
                                                    "common_backend": "torch", "common_backend_version": 1}))
    # tiny_cpu_finetune reads the HF export at $AUDIOLLM_FINETUNE_FROM and its conversion beside it.
    export = path.parent / "finetune_from"
    export.mkdir()
    (path.parent / "finetune_from_megatron").mkdir()
    (path.parent / "finetune_from_megatron" / "metadata.json").write_text((path / "metadata.json").read_text())
    values = {"AUDIOLLM_INIT_CHECKPOINT": str(path), "AUDIOLLM_FINETUNE_FROM": str(export)}
    previous = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    yield path
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True)
def mosaic_mixtures_closed_after_each_test(monkeypatch):
    """Every mixture a test opens in this process (loaders, validation suites) is closed
    when the test ends: mosaic keeps each one's shared memory open until the process
    exits otherwise (orchestrator.data.sources.close_mixture), and a whole suite of
    loaders runs out of file descriptors. Tests that close their loaders themselves
    are unaffected (closing twice is harmless)."""
    from orchestrator.data import sources

    opened = []
    original = sources.open_mixture

    def recording(*args, **kwargs):
        mixture = original(*args, **kwargs)
        opened.append(mixture)
        return mixture

    monkeypatch.setattr(sources, "open_mixture", recording)
    yield
    for mixture in opened:
        sources.close_mixture(mixture)
