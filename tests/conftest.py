"""Suite-wide set-up, and how the suite is spread over processes.

README's test command runs the suite in pytest-xdist workers (`-n auto` in
pyproject.toml's addopts: one worker per core, at most MAX_WORKERS): most tests run one
process on one core, so a second worker uses the core they leave idle (docs/project.md
has the times). `-n 0` runs it in one process.
"""

import json
import os

import pytest

# Beyond 4 workers, the tests that start 2-4 ranks each would contend for cores and memory.
MAX_WORKERS = 4
# Each test file is one unit of work for the workers (its module fixtures are made once);
# tests/slurm is one unit as a whole (one SLURM cluster of each kind per session, on one
# worker). Units start longest first, so that what starts last is short: these
# directories, in this order, then the rest in collection order.
LONG_FIRST = ("tests/slurm/", "tests/rehearsal/", "tests/probe/", "tests/train/", "tests/launchers/")


def pytest_xdist_auto_num_workers(config):
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def _file(nodeid: str) -> str:
    return nodeid.split("::")[0]


def _unit(nodeid: str) -> str:
    path = _file(nodeid)
    return "tests/slurm" if path.startswith("tests/slurm/") else path


def pytest_xdist_make_scheduler(config, log):
    """Workers are sent whole units (_unit), in collection order. (pytest-xdist's own
    `--dist loadgroup` renames tests in a way pytest 9.2 no longer sees.)"""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the order is this file's (pytest_collection_modifyitems)

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return ByUnit(config, log)


def pytest_collection_modifyitems(config, items):
    # Within tests/slurm, the files on the multi-node cluster last: it starts in the
    # background with the first SLURM test (tests/slurm/conftest.py) and is up by then.
    on_nodes = {_file(item.nodeid) for item in items if "slurm_nodes" in item.fixturenames}

    def start_rank(item):
        path = _file(item.nodeid)
        rank = next((i for i, prefix in enumerate(LONG_FIRST) if path.startswith(prefix)), len(LONG_FIRST))
        return rank, path in on_nodes

    items.sort(key=start_rank)  # stable: a file's tests keep their order


def pytest_terminal_summary(terminalreporter):
    """The figures tests measured (the `measured` fixture), gathered from every worker."""
    lines = [value for reports in terminalreporter.stats.values() for report in reports
             for name, value in getattr(report, "user_properties", ()) if name == "measured"]
    if lines:
        terminalreporter.section("measured")
        for line in dict.fromkeys(lines):
            terminalreporter.write_line(line)


@pytest.fixture
def measured(record_property):
    """measured("what: figure") puts a figure a test measured in the session's summary
    (section `measured`) and in its JUnit record: a worker's own output is not shown."""
    return lambda text: record_property("measured", text)


@pytest.fixture(autouse=True, scope="session")
def tests_importable_in_jobs():
    """Jobs that the launchers start (local processes, SLURM tasks) import test-only
    entries and components (tests.launchers.minimal_job, tests.train.stand_in): the
    repository root goes on their PYTHONPATH, which they inherit."""
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
