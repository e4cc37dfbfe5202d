"""A decoder family added by its entries in orchestrator/plan/decoder_families.py alone is
planned, built and trained (tests/models/toy_family_script.py)."""

from pathlib import Path

from tests.distributed_run import torchrun


def test_a_toy_family_needs_only_its_entries_in_the_family_table():
    output = torchrun(Path(__file__).with_name("toy_family_script.py"), 1)
    assert "RESULT toy family:" in output, output[-3000:]
