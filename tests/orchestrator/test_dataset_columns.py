"""A data.text_field (or audio_field) naming a column the local dataset does not have is
refused at plan time, from the dataset's index.json (the job's loader refused it at start,
after the queue)."""

import json

from orchestrator.plan.compose import compose
from orchestrator.plan.resolve import to_object
from orchestrator.plan.validate import validate


def _mds(path, columns):
    """An MDS directory as index.json describes it (the columns of its first shard)."""
    path.mkdir(parents=True)
    shard = {"column_names": columns, "column_encodings": ["bytes"] * len(columns), "format": "mds",
             "raw_data": {"basename": "shard.00000.mds", "bytes": 0}, "samples": 0, "version": 2}
    (path / "index.json").write_text(json.dumps({"version": 2, "shards": [shard]}))
    return path


def _column_errors(*overrides):
    return [f.message for f in validate(to_object(compose(["+recipe=tiny_cpu", *overrides])), "plan")
            if f.rule == "dataset_columns"]


def test_a_text_field_the_dataset_lacks_is_refused_naming_dataset_column_and_columns(tmp_path):
    data = _mds(tmp_path / "calls", ["audio", "transcript"])
    entry = f"data.train=[{{name: calls, path: {data}}}]"
    (error,) = _column_errors(entry, "data.validation=[]")
    assert f"data.train[calls] ({data}) has no column 'text' (data[calls].text_field)" in error
    assert "its columns: ['audio', 'transcript']" in error and "text_field" in error
    assert _column_errors(entry, "data.validation=[]", "data.text_field=transcript") == []
    assert _column_errors(f"data.train=[{{name: calls, path: {data}, text_field: transcript}}]",
                          "data.validation=[]") == []


def test_every_dataset_a_glob_matches_is_checked(tmp_path):
    _mds(tmp_path / "shards" / "a", ["audio", "text"])
    _mds(tmp_path / "shards" / "b", ["wav", "text"])
    errors = _column_errors(f"data.train=[{{name: many, path: '{tmp_path}/shards/*'}}]", "data.validation=[]")
    assert len(errors) == 1 and f"({tmp_path}/shards/b) has no column 'audio'" in errors[0], errors
