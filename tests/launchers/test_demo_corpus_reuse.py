"""`audiollm train` reuses the demo corpus already in data.demo_corpus only when it is the
one the config asks for; another format, size or accent is refused before anything is
submitted, with the values involved and how to go on."""

from __future__ import annotations

import json

import pytest

from launchers.runs import EXIT_INVALID
from launchers.train import train
from orchestrator.data.demo import CORPUS_FORMAT


@pytest.mark.parametrize("manifest, overrides, expected", [
    ({"format": CORPUS_FORMAT - 1, "num_samples": 3000, "accent": None}, [],
     [f"holds a demo corpus of format {CORPUS_FORMAT - 1}", f"reads format {CORPUS_FORMAT}"]),
    ({"format": CORPUS_FORMAT, "num_samples": 3000, "accent": None}, ["data.demo_corpus_samples=6000"],
     ["holds a demo corpus of 3000 training utterances", "data.demo_corpus_samples=6000",
      "set data.demo_corpus_samples=3000 to train on it"]),
    ({"format": CORPUS_FORMAT, "num_samples": 3000, "accent": "nl"}, [],
     ["holds the demo corpus of accent nl", "data.demo_corpus_accent=null"]),
], ids=["format", "size", "accent"])
def test_another_corpus_in_the_directory_is_refused_before_submission(tmp_path, capsys, manifest, overrides,
                                                                      expected):
    corpus = tmp_path / "demo_data"
    corpus.mkdir()
    (corpus / "manifest.json").write_text(json.dumps(manifest))
    code = train([f"data.demo_corpus={corpus}", f"run.output_root={tmp_path / 'outputs'}", *overrides])
    err = capsys.readouterr().err
    assert code == EXIT_INVALID, err
    assert "not submitted" in err and f"data.demo_corpus={corpus}" in err and f"delete {corpus}" in err
    for text in expected:
        assert text in err, (text, err)
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("state.json"))
