"""Remote MDS datasets over a real S3 API (moto's server on loopback, IAM authentication on):
the pre-flight check's messages, and mosaic reading samples by id through a connection
that is dropped on a shard's first request."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.data.remote import RemoteDataError, check_remote_datasets
from tests.data.conftest import write_mds
from tests.data.s3_server import free_port, moto_server, serve_mds  # noqa: F401  (fixtures)

# A hang (mosaic waiting on a shard stuck in PREPARING) must fail the test, not the suite.
pytestmark = pytest.mark.timeout(60)

NUM_SAMPLES = 24


def _samples():
    return [{"audio": bytes([i]) * 300, "text": f"utterance {i}"} for i in range(NUM_SAMPLES)]


@pytest.fixture(scope="module")
def mds_dir(tmp_path_factory):
    # ~3 samples per shard: 8 shards, so one shard can fail while the others are read.
    path = write_mds(tmp_path_factory.mktemp("remote") / "speech", _samples(), size_limit=1 << 10)
    assert len(list(path.glob("shard.*.mds"))) >= 4
    return path


def _dataset(uri, local, download_retry=2):
    """The project's view of one remote dataset (sources.open_mixture), read by sample id."""
    from orchestrator.data.sources import ResolvedDataset, open_mixture

    return open_mixture([ResolvedDataset("speech", uri, 1.0)], seed=0, shuffle=False, cache_root=str(local),
                        download_retry=download_retry)


def _entry(name, path):
    return SimpleNamespace(name=name, path=path)


def _assert_names(err, moto_server, *parts):
    text = str(err)
    for part in parts:
        assert part in text, (part, text)
    for secret in (moto_server.secret_key, moto_server.access_key):
        assert secret not in text


def test_check_passes_for_a_good_dataset_and_skips_local_paths(serve_mds, mds_dir):
    _, uris, proxy = serve_mds({"speech": mds_dir})
    check_remote_datasets([_entry("speech", uris["speech"]), _entry("local", str(mds_dir))])
    assert any(r.endswith("/mds/speech/index.json") for r in proxy.requests)


def test_one_error_lists_wrong_bucket_and_missing_index(serve_mds, mds_dir, moto_server):
    _, uris, _ = serve_mds({"speech": mds_dir})
    bucket = uris["speech"].split("/")[2]
    wrong_bucket = "s3://no-such-bucket-audiollm/mds/speech"
    wrong_prefix = f"s3://{bucket}/mds/speech-typo"
    with pytest.raises(RemoteDataError) as info:
        check_remote_datasets([_entry("speech", uris["speech"]), _entry("en_bucket", wrong_bucket),
                               _entry("en_prefix", wrong_prefix)])
    _assert_names(info.value, moto_server, "2 of 3", "en_bucket", wrong_bucket, "bucket 'no-such-bucket-audiollm' "
                  "does not exist", "en_prefix", wrong_prefix, "index.json missing", "S3_ENDPOINT_URL")
    assert "'speech'" not in str(info.value)
    assert [f[0] for f in info.value.failures] == ["en_bucket", "en_prefix"]


@pytest.mark.parametrize("variable, value, code", [
    ("AWS_SECRET_ACCESS_KEY", "not-the-secret-0123456789", "SignatureDoesNotMatch"),
    ("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNUNKNOWN00", "InvalidAccessKeyId"),
])
def test_refused_credentials_are_named_without_their_values(serve_mds, mds_dir, moto_server, monkeypatch,
                                                            variable, value, code):
    _, uris, _ = serve_mds({"speech": mds_dir})
    monkeypatch.setenv(variable, value)
    with pytest.raises(RemoteDataError) as info:
        check_remote_datasets([_entry("speech", uris["speech"])])
    _assert_names(info.value, moto_server, "speech", uris["speech"], f"credentials refused ({code})",
                  "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    assert value not in str(info.value)


def test_missing_credentials_and_unreachable_endpoint(serve_mds, mds_dir, moto_server, monkeypatch):
    _, uris, _ = serve_mds({"speech": mds_dir})
    with monkeypatch.context() as m:
        m.delenv("AWS_ACCESS_KEY_ID")
        m.delenv("AWS_SECRET_ACCESS_KEY")
        with pytest.raises(RemoteDataError) as info:
            check_remote_datasets([_entry("speech", uris["speech"])])
        _assert_names(info.value, moto_server, "speech", uris["speech"], "no credentials found")
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("S3_ENDPOINT_URL", closed)
    with pytest.raises(RemoteDataError) as info:
        check_remote_datasets([_entry("speech", uris["speech"])])
    _assert_names(info.value, moto_server, "speech", uris["speech"], "endpoint unreachable", closed)


@pytest.mark.parametrize("drops", [1, 3])
def test_samples_by_id_survive_a_dropped_shard_request(serve_mds, mds_dir, tmp_path, drops):
    """drops=1: botocore's own retry absorbs it; drops=3: botocore's 3 attempts all fail and
    a re-attempt (data.download_retry) fetches the shard."""
    _, uris, proxy = serve_mds({"speech": mds_dir})
    dataset = _dataset(uris["speech"], tmp_path / "cache")
    assert dataset.num_samples == NUM_SAMPLES
    flaky_shard = dataset.shards[1].raw_data.basename
    proxy.drop_next(flaky_shard, times=drops)
    expected = _samples()
    for sample_id in reversed(range(NUM_SAMPLES)):  # by id, not by iteration
        sample = dataset[sample_id]
        assert sample["text"] == expected[sample_id]["text"]
        assert sample["audio"] == expected[sample_id]["audio"]
    assert len(proxy.dropped) == drops and all(flaky_shard in r for r in proxy.dropped)
    assert any(r.startswith("GET ") and r.endswith(flaky_shard) for r in proxy.requests)


def test_missing_shard_is_one_line_naming_it_and_the_shard_can_be_read_once_back(serve_mds, mds_dir, moto_server,
                                                                                 tmp_path):
    """A shard listed by index.json but absent: reading a sample of it raises ShardFetchError
    naming dataset, shard and cause, after download_retry re-attempts. Mosaic leaves a
    failed shard PREPARING (the next read would wait forever); the project puts it back to
    REMOTE, so once the object is back the same dataset object reads it."""
    from streaming.base.dataset import _ShardState

    from orchestrator.data.sources import ShardFetchError

    _, uris, proxy = serve_mds({"speech": mds_dir})
    bucket = uris["speech"].split("/")[2]
    dataset = _dataset(uris["speech"], tmp_path / "cache", download_retry=1)
    shard_id = 2
    basename = dataset.shards[shard_id].raw_data.basename
    sample_id = int(sum(s.samples for s in dataset.shards[:shard_id]))
    key = f"mds/speech/{basename}"
    s3 = moto_server.s3()
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.delete_object(Bucket=bucket, Key=key)

    with pytest.raises(ShardFetchError) as info:
        dataset[sample_id]
    shard_uri = f"{uris['speech']}/{basename}"
    line = str(info.value)
    assert "\n" not in line
    _assert_names(line, moto_server, "dataset speech", shard_uri, "object missing")
    # Mosaic asks for the object (HEAD) once per attempt: 1 + 1 re-attempt.
    assert sum(r.endswith(basename) for r in proxy.requests) == 2, proxy.requests
    assert dataset._shard_states[shard_id] == _ShardState.REMOTE

    s3.put_object(Bucket=bucket, Key=key, Body=body)
    assert dataset[sample_id]["text"] == _samples()[sample_id]["text"]
