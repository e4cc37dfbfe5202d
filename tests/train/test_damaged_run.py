"""What a damaged run directory or a full disk does to `audiollm train` and `audiollm
eval`, through the real CLI and the real trainer (2 CPU ranks): a checkpoint damaged
after it was written is set aside and the run resumes, exactly, from the newest complete
one; when every checkpoint is damaged the run stops and says so instead of starting
over; a save that fills the disk is removed and the run fails in one line."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.distributed_run import REPO
from tests.train.audiollm_runs import audiollm_cli, make_corpus, train_overrides

pytestmark = pytest.mark.multiprocess

ITERS, SAVE_AT = 6, 3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 6-step run, checkpoints at steps 3 and 6; (overrides, run directory, losses)."""
    root = tmp_path_factory.mktemp("damaged")
    corpus = make_corpus(root / "corpus")
    overrides = [*train_overrides(corpus), "launcher.gpus_per_node=2", f"train.iters={ITERS}",
                 f"train.save_interval={SAVE_AT}", "run.name=damaged", f"run.output_root={root / 'outputs'}"]
    proc = audiollm_cli(["train", *overrides], cwd=root)
    assert proc.returncode == 0, proc.stdout[-6000:]
    run_dir = root / "outputs" / "tiny_cpu" / "damaged"
    return overrides, run_dir, _losses(run_dir)


def _losses(run_dir) -> list:
    return [(row["step"], row["loss"]) for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def _largest_file(step_dir):
    return max((p for p in step_dir.rglob("*") if p.is_file() and p.name != "manifest.json"),
               key=lambda p: p.stat().st_size)


def test_a_truncated_or_overwritten_checkpoint_is_set_aside_and_the_run_resumes_exactly(trained):
    overrides, run_dir, straight = trained
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step_*")) == ["step_000003", "step_000006"]
    manifest = json.loads((checkpoints / "step_000006" / "manifest.json").read_text())["files"]
    assert "rank_state/rank_00001.pt" in manifest and all(r["size"] > 0 for r in manifest.values())

    # `audiollm eval` refuses the damaged one in one line, naming the complete one.
    shard = _largest_file(checkpoints / "step_000006")
    size = shard.stat().st_size
    with open(shard, "r+b") as handle:  # truncated: a copy or a save cut short
        handle.truncate(size // 2)
    proc = audiollm_cli(["eval", str(run_dir)], cwd=run_dir)
    assert proc.returncode == 2, proc.stdout[-4000:]
    name = shard.relative_to(checkpoints / "step_000006").as_posix()
    assert proc.stdout.strip().splitlines()[-1] == (
        f"checkpoint {checkpoints / 'step_000006'} is damaged: {name} has {size // 2} bytes, {size} were written; "
        f"evaluate the newest complete one with --checkpoint {checkpoints / 'step_000003'}"), proc.stdout[-2000:]

    plan = (run_dir / "plan.json").read_bytes()
    (run_dir / "plan.json").write_bytes(plan[:100])
    proc = audiollm_cli(["eval", str(run_dir), "--checkpoint", str(checkpoints / "step_000003")], cwd=run_dir)
    assert proc.returncode == 2 and proc.stdout.strip().splitlines()[-1].startswith(
        f"{run_dir / 'plan.json'} is not valid JSON: "), proc.stdout[-2000:]
    (run_dir / "plan.json").write_bytes(plan)

    # The same command again: steps 4 to 6 from step 3, loss for loss.
    proc = audiollm_cli(["train", *overrides], cwd=run_dir)
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert (f"checkpoint {checkpoints / 'step_000006'} is damaged: {name} has {size // 2} bytes, {size} were "
            f"written; set aside as step_000006.damaged") in proc.stdout, proc.stdout[-4000:]
    assert "resuming from step_000003, the newest complete checkpoint" in proc.stdout
    assert _losses(run_dir) == straight  # metrics.jsonl keeps the rows up to the resumed step
    assert (checkpoints / "latest").read_text().strip() == "step_000006"
    assert (checkpoints / "step_000006.damaged").is_dir()

    # Overwritten in place (same size, other bytes): only the checksum tells.
    shard = _largest_file(checkpoints / "step_000006")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    shutil.rmtree(checkpoints / "step_000003" / "rank_state")  # and the one before it lost a directory
    proc = audiollm_cli(["train", *overrides], cwd=run_dir)
    assert proc.returncode == 1, proc.stdout[-6000:]
    name = shard.relative_to(checkpoints / "step_000006").as_posix()
    assert f"{name} does not hold what was written (CRC-32 differs)" in proc.stdout, proc.stdout[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    failed = re.match(r"job failed: rank ([01]) on \S+: NoCompleteCheckpoint: ", last)
    assert failed, last
    assert last.split(": ", 2)[2].startswith(f"NoCompleteCheckpoint: no complete checkpoint in {checkpoints}: step_000006: "
                           f"{name} does not hold what was written (CRC-32 differs); step_000003: "
                           f"rank_state/rank_00000.pt is missing"), last
    assert "Not starting over in silence" in last and f"(log: {run_dir}/logs/rank{failed[1]}.log)" in last
    assert not (run_dir / "checkpoints" / "step_000001").exists()  # nothing trained from scratch
    assert _losses(run_dir) == straight
    # Run again: the damaged checkpoints are set aside by now, and it still refuses.
    proc = audiollm_cli(["train", *overrides], cwd=run_dir)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1 and "no complete checkpoint" in last and \
        "step_000006.damaged (set aside earlier); step_000003.damaged (set aside earlier). Damaged" in last, \
        proc.stdout[-3000:]
    assert _losses(run_dir) == straight



def test_a_full_disk_at_a_save_fails_the_run_in_one_line_and_the_rerun_resumes_exactly(trained, tmp_path):
    """The run directory on a file system that holds one checkpoint, not two (a tmpfs in a
    mount namespace of its own): the save of step 6 fails. The partial save is removed,
    the run is marked FAILED, the console's last line says what happened, and once there
    is room the same command resumes from step 3 with the straight run's losses."""
    overrides, first_dir, straight = trained
    step_bytes = max(sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
                     for d in (first_dir / "checkpoints").glob("step_*"))  # (a test above may set one aside)
    assert step_bytes > 1 << 20
    out, kept = tmp_path / "out", tmp_path / "kept"
    out.mkdir()
    overrides = [o for o in overrides if not o.startswith("run.output_root=")] + [f"run.output_root={out}"]
    run_dir = out / "tiny_cpu" / "damaged"
    cli = f"{sys.executable} -m orchestrator.cli train {' '.join(shlex.quote(o) for o in overrides)}"
    script = f"""
mount -t tmpfs -o size={int(step_bytes * 1.6)} tmpfs {out} || exit 90
{cli} > {tmp_path}/first.txt 2>&1; echo $? > {tmp_path}/first.rc
cp -r {run_dir} {kept}
mount -o remount,size={4 * step_bytes} {out}
{cli} > {tmp_path}/again.txt 2>&1; echo $? > {tmp_path}/again.rc
cp {run_dir}/metrics.jsonl {kept}/metrics_again.jsonl
"""
    unshare = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        unshare.insert(1, "--map-root-user")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*unshare, "bash", "-c", script], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, f"a small file system for the run could not be made: {proc.stdout}{proc.stderr}"
    first = (tmp_path / "first.txt").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "1", first[-4000:]
    checkpoints = run_dir / "checkpoints"
    assert re.fullmatch(
        rf"job failed: rank [01] on \S+: DiskFull: disk full at {re.escape(str(checkpoints))} while saving step 6; "
        r"latest is step_000003, which a rerun of the same command resumes from\. The partial save was removed; free "
        r"space there \(or lower train.keep_last, now 2, or raise train.keep_every, now 0\) and run the same command "
        r"again \(log: .*/logs/rank[01]\.log\)(; rank [01] (failed after it|raised the same))?",
        first.strip().splitlines()[-1]), first[-4000:]
    assert "lost sys.stderr" not in first and "unraisablehook" not in first, first[-4000:]
    assert sorted(p.name for p in (kept / "checkpoints").iterdir()) == [
        "iter_0000003", "latest", "latest_checkpointed_iteration.txt", "step_000003"]
    assert json.loads((kept / "state.json").read_text())["state"] == "FAILED"
    again = (tmp_path / "again.txt").read_text()
    assert (tmp_path / "again.rc").read_text().strip() == "0", again[-4000:]
    assert "resumed from" in again and "step_000003" in again, again[-4000:]
    rows = [json.loads(line) for line in (kept / "metrics_again.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == straight


def test_a_broken_dataset_stops_a_skipping_run_naming_it(trained, tmp_path):
    """data.on_bad_sample=skip, and one of three training datasets is garbage: the
    console tells the first skips, then the run stops in one line naming the dataset,
    judged over the two data-parallel ranks' reads together (each alone under the bound's
    minimum of 10 bad samples; before, each rank judged its own and the job went on
    until one rank had 10)."""
    from tests.data.conftest import write_mds

    overrides, first_dir, _ = trained
    corpus = first_dir.parents[2] / "corpus"
    broken = write_mds(tmp_path / "broken", [{"audio": b"not audio at all", "text": "one two"}] * 40)
    train = ",".join(f"{{name:{name},path:'{corpus / 'train' / name}'}}" for name in ("tones_a", "tones_b"))
    overrides = [o for o in overrides if not o.startswith(("data.train=", "run.output_root="))] + [
        f"data.train=[{train},{{name:broken,path:'{broken}',weight:2.0}}]", "data.on_bad_sample=skip",
        f"run.output_root={tmp_path / 'out'}"]
    proc = audiollm_cli(["train", *overrides], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-4000:]
    assert "skipped a bad sample (data.on_bad_sample=skip) in dataset broken: shard " in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert re.match(r"job failed: rank [01] on \S+: BadSampleError: dataset broken: (\d+) of the (\d+) samples read "
                    r"by the "
                    r"job's 2 data-parallel rank\(s\) together are bad \(100%, more than data.max_bad_fraction=0.01\)",
                    last), last
    # judged over both ranks: the job stopped before either rank alone had 10 bad samples
    # (each rank says so at its 10th)
    assert "dataset broken: 10 bad samples skipped" not in proc.stdout, proc.stdout[-4000:]
