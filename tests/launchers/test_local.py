"""launcher=local: 2 real processes over gloo through submitit's local executor."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time

import pytest

from launchers.status import cancel, status
from launchers.train import train
from orchestrator.plan.rundir import read_json, read_metrics
from orchestrator.runtime.ports import END_PORT, FIRST_PORT

from .helpers import (launches, losses, rank_pids, signal_at_start, status_cause, tiny_overrides, wait_for_end,
                      wait_for_step, wait_until)

pytestmark = pytest.mark.multiprocess

ITERS = 12


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted 2-rank run; its per-step losses are what interrupted runs must reproduce."""
    root = tmp_path_factory.mktemp("local-ref")
    code = train(tiny_overrides(root, "run.name=ref", iters=ITERS))
    return code, root / "tiny_cpu" / "ref"


def test_local_run_writes_the_run_directory_and_streams_rank0(reference, capfd):
    code, run_dir = reference
    assert code == 0
    assert sorted(losses(run_dir)) == list(range(1, ITERS + 1))
    assert read_json(run_dir / "state.json")["state"] == "COMPLETED"
    assert json.loads((run_dir / "plan.json").read_text())["world_size"] == 2
    assert "gpus_per_node: 2" in (run_dir / "config.yaml").read_text()
    (launch,) = launches(run_dir)
    assert launch["kind"] == "local" and launch["job_ids"] and launch["version"] and launch["command"]
    assert "attempt 1" in (run_dir / "logs" / "rank0.log").read_text()
    # Each CPU rank gets its share of the cores (unless OMP_NUM_THREADS says otherwise).
    threads = os.environ.get("OMP_NUM_THREADS") or max(1, len(os.sched_getaffinity(0)) // 2)
    for rank in (0, 1):
        log = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert "] rank %d/2 pid" % rank in log and re.search(rf" cpu threads {threads}\b", log), log[-2000:]
    # The controller's rendezvous port, one for both ranks, below the ports the kernel lends
    # to outgoing connections (orchestrator/runtime/ports.py).
    ports = [re.findall(r" master \S+:(\d+)", (run_dir / "logs" / f"rank{rank}.log").read_text()) for rank in (0, 1)]
    assert ports[0] == ports[1] and len(ports[0]) == 1 and FIRST_PORT <= int(ports[0][0]) < END_PORT, ports
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{ITERS}"
    assert len((run_dir / "wandb_id").read_text().strip()) == 16


def test_a_rank_preempted_as_it_starts_stops_at_once_and_reproduces_every_loss(reference, tmp_path, tiny, monkeypatch):
    """USR2 reaches rank 1 as its interpreter starts, before any of the job's Python
    (a sitecustomize on PYTHONPATH sends it, once): the signal is held until the job's
    handlers exist (launchers/rank_start.py, launchers/local_controller.py), where it
    used to kill the rank. Both ranks agree to stop at the first boundary (the minimal
    job asks before its first step); the run is requeued, resumes, and reproduces every
    loss."""
    _, ref_dir = reference
    hook = signal_at_start(tmp_path, 1, signal.SIGUSR2)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [hook, os.environ.get("PYTHONPATH")])))
    run_dir = tmp_path / "tiny_cpu" / "pre"
    assert train(tiny(tmp_path, "run.name=pre", iters=ITERS)) == 0
    assert os.path.exists(os.path.join(hook, "sent"))
    info = wait_for_end(run_dir, timeout=180)
    assert info["state"] == "COMPLETED", info
    state = read_json(run_dir / "state.json")
    assert state["requeues"] == 1 and state["attempt"] == 2 and state["signal"] == "SIGUSR2", state
    assert len(rank_pids(run_dir, 0)) == 2  # the tasks were started again
    assert "resumed from step_0" in (run_dir / "logs" / "rank0.log").read_text()
    assert losses(run_dir) == losses(ref_dir)


def test_cancelled_run_continues_when_the_same_command_runs_again(reference, tmp_path, tiny, monkeypatch, capsys):
    _, ref_dir = reference
    # Slow enough steps that the job still runs when the second command checks, however
    # long that command takes to compose and validate on a busy machine (at 0.25 s the
    # job once finished first, in a suite beside other multi-process tests).
    monkeypatch.setenv("AUDIOLLM_MINIMAL_STEP_DELAY_S", "1")
    overrides = tiny(tmp_path, iters=ITERS)  # no run.name: the run is found from the config
    assert train([*overrides, "launcher.wait=false"]) == 0
    (run_dir,) = (tmp_path / "tiny_cpu").iterdir()
    wait_for_step(run_dir, 3, timeout=120)
    assert train(overrides) == 2  # a second job may not write the same run directory
    assert "already has job" in capsys.readouterr().err
    assert cancel(run_dir) == 0  # SIGTERM: checkpoint at the next step boundary, then stop
    info = wait_for_end(run_dir, timeout=120)
    assert info["state"] == "STOPPED" and info["step"] < ITERS, info
    stopped_at = max(losses(run_dir))
    assert stopped_at < ITERS
    capsys.readouterr()
    monkeypatch.setenv("AUDIOLLM_MINIMAL_STEP_DELAY_S", "0")
    assert train(overrides) == 0
    out = capsys.readouterr().out
    assert f"resuming run {run_dir}" in out and f"resumed from step_{stopped_at}" in out
    assert [launch["resumed"] for launch in launches(run_dir)] == [False, True]
    assert losses(run_dir) == losses(ref_dir)
    assert status(run_dir) == 0
    assert f"step      {ITERS}/{ITERS}" in capsys.readouterr().out


def test_requeues_are_bounded_by_max_requeues(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("AUDIOLLM_MINIMAL_STEP_DELAY_S", "0.25")
    run_dir = tmp_path / "tiny_cpu" / "bounded"
    overrides = tiny(tmp_path, "run.name=bounded", "launcher.wait=false", "launcher.max_requeues=0", iters=ITERS)
    assert train(overrides) == 0
    wait_for_step(run_dir, 2, timeout=120)
    os.kill(rank_pids(run_dir, 0)[0], signal.SIGUSR2)
    info = wait_for_end(run_dir, timeout=120)
    assert info["state"] == "FAILED", info
    assert "launcher.max_requeues=0" in info["error"] and "run.resume=auto" in info["error"]
    assert len(rank_pids(run_dir, 0)) == 1  # not restarted
    stopped = int((run_dir / "checkpoints" / "latest").read_text().strip().split("_")[1])
    assert 2 <= stopped < ITERS and max(losses(run_dir)) == stopped


def test_local_sweep_runs_each_point_and_writes_the_summary(tmp_path, tiny, capsys):
    code = train(tiny(tmp_path, "run.name=sw", "train.seed=1,2", ranks=1, iters=3), multirun=True)
    assert code == 0
    sweep_dir = tmp_path / "tiny_cpu" / "sw"
    rows = (sweep_dir / "summary.txt").read_text().splitlines()[2:]
    assert [row.split()[:4] for row in rows] == [
        ["000", "train.seed=1", "COMPLETED", "3/3"], ["001", "train.seed=2", "COMPLETED", "3/3"],
    ]
    assert losses(sweep_dir / "000") != losses(sweep_dir / "001")
    assert "=== point 001: train.seed=2" in capsys.readouterr().out


def test_the_same_command_twice_at_once_runs_once_and_refuses_the_other_naming_the_job(tmp_path):
    """Two identical `audiollm train` commands started together (through the real CLI):
    without the submission lock both passed the "already running" check before either
    recorded its job, and both ran in one directory (interleaved metrics, a crash at the
    save). Now one runs and the other is refused with the run directory and the job id."""
    import subprocess
    import sys

    from tests.distributed_run import REPO

    argv = [sys.executable, "-m", "orchestrator.cli", "train", *tiny_overrides(tmp_path, "run.name=twice", iters=6)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
             for _ in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], list(zip(codes, outs))
    refused = outs[codes.index(2)]
    run_dir = tmp_path / "tiny_cpu" / "twice"
    (job_id,) = launches(run_dir)[0]["job_ids"]
    assert f"run {run_dir} already has job {job_id}" in refused, refused
    assert len(launches(run_dir)) == 1
    assert [row["step"] for row in read_metrics(run_dir)] == list(range(1, 7))  # one run's steps, once each


def _cli_in_a_terminal_group(argv_tail, cwd, step_delay: str, **env_extra: str):
    """`audiollm train` started as a terminal starts a foreground command: the leader of a
    process group of its own, which the terminal's Ctrl-C (SIGINT) and hang-up signal as
    a whole (os.killpg)."""
    import subprocess
    import sys

    from tests.distributed_run import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO), "AUDIOLLM_MINIMAL_STEP_DELAY_S": step_delay, **env_extra}
    return subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "train", *argv_tail], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO, start_new_session=True)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_terminals_signal_checkpoints_at_the_next_step_and_the_rerun_resumes_exactly(reference, tmp_path, sig, code):
    """Ctrl-C (SIGINT to the whole foreground group), SIGTERM to the group (a login
    session ending) and SIGHUP (the terminal closing) no longer reach the ranks: the
    command asks the job to checkpoint at its next step boundary and stop, says so, and
    waits for it (no orphaned job); the same command then resumes with the uninterrupted
    run's losses."""
    _, ref_dir = reference
    argv = tiny_overrides(tmp_path, "run.name=signalled", iters=ITERS)
    proc = _cli_in_a_terminal_group(argv, tmp_path, "0.25")
    run_dir = tmp_path / "tiny_cpu" / "signalled"
    wait_for_step(run_dir, 3, timeout=120)
    os.killpg(proc.pid, sig)
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode == code, out
    assert "asking the job to checkpoint at its next step and stop" in out and "Traceback" not in out, out
    stopped_at = max(losses(run_dir))
    assert 3 <= stopped_at < ITERS and re.search(rf"the same command resumes from checkpoints/step_0*{stopped_at}\b", out), out
    assert wait_for_end(run_dir, timeout=60)["state"] == "STOPPED"
    again = _cli_in_a_terminal_group(argv, tmp_path, "0")
    out = again.communicate(timeout=300)[0]
    assert again.returncode == 0 and f"resumed from step_{stopped_at}" in out, out
    assert losses(run_dir) == losses(ref_dir)


def test_a_second_ctrl_c_stops_at_once_and_says_what_is_lost(tmp_path):
    argv = tiny_overrides(tmp_path, "run.name=twice_interrupted", iters=ITERS)
    proc = _cli_in_a_terminal_group(argv, tmp_path, "2")  # slow steps: the first request is still pending
    run_dir = tmp_path / "tiny_cpu" / "twice_interrupted"
    wait_for_step(run_dir, 1, timeout=120)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, out
    assert "stopped at once: the steps since the last checkpoint are lost" in out, out
    job_pids = rank_pids(run_dir, 0)
    for pid in job_pids:  # nothing of the job is left running
        wait_until(lambda: not _alive(pid), 30, f"rank 0 (pid {pid}) to end", [run_dir])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_failure_inside_the_job_is_named_in_one_line_by_the_console_and_status(tmp_path):
    """Rank 1 raises at step 3; rank 0 then fails only because its peer is gone. The
    console's last line, and `audiollm status` afterwards, name rank 1, its host, its own
    error, where it was raised and the log to read, then the rank that followed: not rank
    0's lost connection (the last line of rank 0's traceback, which status printed before)."""
    argv = tiny_overrides(tmp_path, "run.name=failing", iters=ITERS)
    proc = _cli_in_a_terminal_group(argv, tmp_path, "0", AUDIOLLM_MINIMAL_FAIL="1:3")
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode == 1, out
    run_dir = tmp_path / "tiny_cpu" / "failing"
    cause = (rf"rank 1 on {re.escape(socket.gethostname())}: ValueError: batch of step 3 has 3 columns, the model "
             r"takes 16 \(AUDIOLLM_MINIMAL_FAIL\) \(raised in tests/launchers/minimal_job\.py:\d+\) "
             + re.escape(f"(log: {run_dir}/logs/rank1.log); rank 0 failed after it"))
    assert read_json(run_dir / "state.json")["state"] == "FAILED"
    assert re.fullmatch(cause, status_cause(run_dir))
    assert re.fullmatch("job failed: " + cause, out.strip().splitlines()[-1]), out[-3000:]


def test_a_rank_killed_by_a_signal_is_named_with_the_signal(tmp_path):
    """SIGKILL (the out-of-memory killer) leaves no Python error in the killed rank; its
    peer's is gloo's lost connection. The console and `audiollm status` name the rank, its
    host and the signal."""
    argv = tiny_overrides(tmp_path, "run.name=killed", iters=ITERS)
    proc = _cli_in_a_terminal_group(argv, tmp_path, "0.25")
    run_dir = tmp_path / "tiny_cpu" / "killed"
    wait_for_step(run_dir, 2, timeout=120)
    os.kill(rank_pids(run_dir, 1)[0], signal.SIGKILL)
    out = proc.communicate(timeout=180)[0]
    assert proc.returncode == 1, out
    cause = (f"rank 1 on {socket.gethostname()} was killed by signal 9 (SIGKILL: the out-of-memory killer or a kill "
             f"-9) (log: {run_dir}/logs/rank1.log); rank 0 failed after it")
    assert status_cause(run_dir) == cause
    assert out.strip().splitlines()[-1] == f"job failed: {cause}", out[-3000:]
    assert read_json(run_dir / "logs" / "failure_rank0.json")["lost_peer"] is True


def test_a_rank_dead_before_the_rendezvous_ends_the_job_instead_of_leaving_its_peer_waiting(tmp_path):
    """Rank 1 is killed as its interpreter starts: rank 0 waits for it at the rendezvous,
    which no timeout bounds closely (it waited past 15 minutes). The local controller
    kills rank 0 once rank 1 has been gone PEERS_GRACE_S, and the job fails naming rank 1
    and its signal, rank 0 as having failed after it."""
    from launchers.watchdog import PEERS_GRACE_S
    from tests.distributed_run import REPO

    argv = tiny_overrides(tmp_path, "run.name=stillborn", iters=ITERS)
    hook = signal_at_start(tmp_path, 1, signal.SIGKILL)
    proc = _cli_in_a_terminal_group(argv, tmp_path, "0", PYTHONPATH=os.pathsep.join([hook, str(REPO)]))
    out = proc.communicate(timeout=120 + PEERS_GRACE_S)[0]
    assert proc.returncode == 1, out
    run_dir = tmp_path / "tiny_cpu" / "stillborn"
    cause = (f"rank 1 on {socket.gethostname()} was killed by signal 9 (SIGKILL: the out-of-memory killer or a kill "
             f"-9) (log: {run_dir}/logs/rank1.log); rank 0 failed after it")
    assert status_cause(run_dir) == cause
    assert out.strip().splitlines()[-1] == f"job failed: {cause}", out[-3000:]


def test_a_missing_local_dataset_is_refused_before_submission(tmp_path):
    ghost = tmp_path / "no_such_dataset"
    argv = tiny_overrides(tmp_path, "run.name=ghost", f"data.train=[{{name:ghost,path:'{ghost}'}}]")
    proc = _cli_in_a_terminal_group(argv, tmp_path, "0")
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2, out
    assert out.strip().splitlines()[-2:] == [
        "invalid configuration:",
        f"  - error: [local_paths] data.train[ghost].path: {ghost} does not exist; an MDS dataset is a directory "
        f"with index.json; launcher=local runs the job on this machine, where it would stop at start: point it at "
        f"what exists here (or write it first)"], out
    assert not (tmp_path / "tiny_cpu" / "ghost" / "launch.json").exists()


def test_status_of_a_damaged_run_directory_names_each_damaged_file(reference, tmp_path, capsys):
    """Files cut short by hand or by a crash: `audiollm status` says which and what is
    wrong, and still tells a finished run from its checkpoints, instead of a YAML
    traceback, DIED, or COMPLETED at step 4 of 12."""
    import shutil

    _, ref_dir = reference
    run_dir = tmp_path / "copy"
    shutil.copytree(ref_dir, run_dir)

    def status_lines() -> list[str]:
        capsys.readouterr()
        assert status(run_dir) == 0
        return capsys.readouterr().out.splitlines()

    def cut(name: str, keep: int) -> None:
        data = (ref_dir / name).read_bytes()
        (run_dir / name).write_bytes(data[:keep])

    cut("config.yaml", 40)
    size = len((run_dir / "config.yaml").read_bytes())
    lines = status_lines()
    assert f"damaged   config.yaml is damaged ({size} bytes, cut short: its last line is not '# end of config.yaml')" \
        in lines, lines
    shutil.copy(ref_dir / "config.yaml", run_dir / "config.yaml")

    cut("state.json", 20)
    lines = status_lines()
    assert lines[1] == "state     COMPLETED (scheduler: ENDED, job %s)" % launches(run_dir)[0]["job_ids"][0], lines
    assert any(line.startswith("damaged   state.json is damaged (20 bytes, not valid JSON") for line in lines), lines
    shutil.copy(ref_dir / "state.json", run_dir / "state.json")

    text = (ref_dir / "metrics.jsonl").read_text()
    (run_dir / "metrics.jsonl").write_text("".join(text.splitlines(keepends=True)[:4]) + '{"step": 5, "lo')
    lines = status_lines()
    assert f"step      4/{ITERS}" in lines and "state     COMPLETED" in lines[1], lines
    assert f"damaged   metrics.jsonl ends at step 4, before the checkpoint of step {ITERS} (lines were lost)" in lines


def test_an_unwritable_output_root_is_refused_in_one_line(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    proc = _cli_in_a_terminal_group(tiny_overrides(blocker / "outputs", "run.name=nowhere"), tmp_path, "0")
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 2 and "Traceback" not in out, out
    assert out.strip().splitlines()[-1].startswith(f"  - cannot write the run directory {blocker}/outputs/tiny_cpu/nowhere: "
                                                   "[Errno 20] Not a directory"), out
