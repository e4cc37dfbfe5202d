"""`audiollm train` from s3:// datasets on a real S3 API (moto's server on loopback, behind a
proxy that drops a connection): shards fetched on demand into data.cache_dir within
data.cache_limit, a shard whose first fetch fails is fetched again, and bad remote input
stops the run before the first step with one error naming what and where. Credentials
come from the environment and never reach the run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.s3_server import child_env, moto_server, serve_mds  # noqa: F401  (fixtures)
from tests.distributed_run import REPO
from tests.train.audiollm_runs import TRAIN_SETS, VAL_SET, make_corpus, train_overrides

SECRET_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


def _train(overrides: list, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    env = {**child_env(env), "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", "import sys; from orchestrator.cli import main; "
                           "sys.exit(main(sys.argv[1:]))", "train", *overrides], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)


def _remote_overrides(corpus: Path, uris: dict, cache: Path, run_name: str) -> list:
    train = ",".join(f"{{name:{name},path:'{uris[name]}'}}" for name in TRAIN_SETS)
    local = [o for o in train_overrides(corpus) if not o.startswith(("data.train=", "data.validation="))]
    return [*local, f"data.train=[{train}]", f"data.validation=[{{name:{VAL_SET},path:'{uris[VAL_SET]}'}}]",
            f"data.cache_dir={cache}", f"run.name={run_name}", f"run.output_root={cache.parent / 'outputs'}"]


def _largest_shard(corpus: Path) -> int:
    return max(p.stat().st_size for p in corpus.rglob("shard.*.mds"))


@pytest.mark.multiprocess
def test_trains_from_s3_fetching_shards_on_demand_within_the_cache_limit(serve_mds, tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    env, uris, proxy = serve_mds({name: corpus / "train" / name for name in TRAIN_SETS}
                                 | {VAL_SET: corpus / "val" / VAL_SET})
    victim = "mds/tones_b/shard.00001.mds"
    assert (corpus / "train" / "tones_b" / "shard.00001.mds").exists()
    proxy.drop_next(victim)  # its first fetch: the connection closes without a reply
    limit = 4 * _largest_shard(corpus)  # mosaic's smallest allowed limit: it must evict
    cache = tmp_path / "cache"
    overrides = _remote_overrides(corpus, uris, cache, "s3run") + [
        "train.iters=3", "train.eval_interval=3", f"data.cache_limit={limit}", "data.num_workers=1",
        "data.feature_cache_mb=0"]
    proc = _train(overrides, env, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert any(victim in path for path in proxy.dropped), proxy.dropped
    assert sum(victim in path for path in proxy.requests) >= 2  # dropped once, then fetched
    (run_dir,) = [m.parent for m in (tmp_path / "outputs").rglob("metrics.jsonl")]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and "val_loss" in rows[-1]
    # Shards were fetched into data.cache_dir (one directory per process), each process
    # within the limit.
    per_process = [d for d in cache.iterdir() if d.is_dir()]
    assert per_process
    for d in per_process:
        assert sum(p.stat().st_size for p in d.rglob("shard.*.mds")) <= limit, d
    assert any(d.rglob("shard.*.mds") for d in per_process)
    # Nothing secret in the run directory (plan, config, logs, checkpoints, metrics).
    secrets = [env[v].encode() for v in SECRET_VARS]
    leaked = [str(p) for p in run_dir.rglob("*") if p.is_file() and any(s in p.read_bytes() for s in secrets)]
    assert leaked == []


@pytest.mark.multiprocess
def test_bad_remote_input_stops_the_run_before_the_first_step_naming_it(serve_mds, tmp_path):
    corpus = make_corpus(tmp_path / "corpus")
    env, uris, _ = serve_mds({name: corpus / "train" / name for name in TRAIN_SETS}
                             | {VAL_SET: corpus / "val" / VAL_SET})
    cache = tmp_path / "cache"
    base = _remote_overrides(corpus, uris, cache, "bad") + ["train.iters=3", "train.eval_interval=0"]

    wrong_bucket = dict(uris, tones_a="s3://no-such-bucket-audiollm/mds/tones_a")
    proc = _train(_remote_overrides(corpus, wrong_bucket, cache, "bad") + ["train.iters=3"], env, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "tones_a" in out and "s3://no-such-bucket-audiollm/mds/tones_a" in out and "bucket" in out, out[-4000:]
    assert "step 1/" not in out

    refused = dict(env, AWS_SECRET_ACCESS_KEY="not-the-right-secret-0123")
    proc = _train(base, refused, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "credentials" in out and "AWS_SECRET_ACCESS_KEY" in out, out[-4000:]
    assert "not-the-right-secret-0123" not in out and env["AWS_SECRET_ACCESS_KEY"] not in out

    # Shards the index lists but the bucket lacks: the first read of one stops the run,
    # naming the dataset and the shard (not counted as a bad sample, whatever the policy).
    import boto3

    s3 = boto3.client("s3", endpoint_url=env["S3_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    bucket = uris["tones_a"].split("/")[2]
    shards = sorted(p.name for p in (corpus / "train" / "tones_a").glob("shard.*.mds"))
    for name in shards:
        s3.delete_object(Bucket=bucket, Key=f"mds/tones_a/{name}")
    proc = _train(base + ["data.on_bad_sample=skip", "data.download_retry=0"], env, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    named = [n for n in shards if f"dataset tones_a: shard {uris['tones_a']}/{n} could not be downloaded" in out]
    assert named and "object missing" in out, out[-4000:]
    assert "step 1/" not in out
    for p in (tmp_path / "outputs").rglob("*"):
        assert not (p.is_file() and env["AWS_SECRET_ACCESS_KEY"].encode() in p.read_bytes()), p
