"""Suite-wide set-up."""

import json

import pytest


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
    previous = os.environ.get("AUDIOLLM_INIT_CHECKPOINT")
    os.environ["AUDIOLLM_INIT_CHECKPOINT"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("AUDIOLLM_INIT_CHECKPOINT", None)
    else:
        os.environ["AUDIOLLM_INIT_CHECKPOINT"] = previous
