"""One data reader per model replica (data.replica_reader, orchestrator/train/replica_reader.py):
at TP=2, CP=2 and PP=2 (two processes, one replica) each rank's training and validation
micro-batches, as its forward receives them, are bit for bit the ones it reads itself
with data.replica_reader=false; the reader reads each sample once and its peer none."""

from __future__ import annotations

import pytest

from tests.train.audiollm_runs import make_corpus, write_audiollm_run_dir
from tests.train.jobs import launch, result

MICROBATCHES = 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("replica_corpus"))


@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", [{"tp": 2}, {"cp": 2}, {"pp": 2}], ids=["tp2", "cp2", "pp2"])
def test_the_peers_receive_the_batches_they_would_have_read_and_read_nothing(corpus, tmp_path, layout):
    run_dir = write_audiollm_run_dir(tmp_path / "replica", corpus, extra=["model.adapter.ctc_weight=0"], **layout)
    reader, peer = result(launch("replica_script.py", 2, str(run_dir), str(MICROBATCHES), log_dir=tmp_path))["ranks"]
    for rank in (reader, peer):
        assert rank["on"]["train"] == rank["off"]["train"] and rank["on"]["val"] == rank["off"]["val"]
        assert rank["on"]["state"] == rank["off"]["state"] and rank["on"]["names"] == rank["off"]["names"]
    if "cp" in layout:  # each CP rank's share of the same micro-batch
        assert reader["on"]["train"] != peer["on"]["train"]
    else:
        assert reader["on"]["train"] == peer["on"]["train"]
    # Reads: every rank read the replica's samples itself; now the reader alone does.
    assert reader["off"]["reads"] == peer["off"]["reads"] > 0
    assert reader["on"]["reads"] == reader["off"]["reads"] and peer["on"]["reads"] == 0
