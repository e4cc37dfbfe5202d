"""Why a job failed, in one line (launchers/failures.py), from what the ranks and the
launcher recorded: no processes started. The srun reports and sacct rows below are as
the test clusters wrote them (tests/slurm), except the out-of-memory ones, in the form
SLURM 22.05 writes them (its srun prints "Out Of Memory" for a task its cgroup killed;
the test clusters run without cgroups). The whole paths, from a failing job to `audiollm
status`, are in tests/launchers/test_local.py (an error, a SIGKILL),
tests/slurm/test_slurm_jobs.py (both on SLURM) and tests/slurm/test_multinode.py (a
node lost)."""

from __future__ import annotations

import json
import time

import pytest

from launchers import failures, slurm_records
from launchers.failures import TaskEnds, explain
from launchers.slurm_records import sacct_end, srun_report


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps({"world_size": 4}))
    for rank, host in enumerate(["node1", "node1", "node2", "node2"]):
        (run / "heartbeats").mkdir(exist_ok=True)
        (run / "heartbeats" / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "host": host}))
    return run


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - with its traceback, as the job records it
        return caught


def _record(run_dir, rank, exc, job_id="7", at=None):
    failures.record(run_dir, rank, job_id, _raise(exc))
    if at is not None:  # the order the ranks failed in
        path = failures.failure_path(run_dir, rank)
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "time": at, "host": f"node{1 + rank // 2}"}))


LOST = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
                    "[127.0.0.1]:6338. This is typically caused by a remote worker crashing.")


def test_the_first_own_error_is_the_cause_and_the_ranks_that_lost_it_follow(run_dir):
    now = time.time()
    _record(run_dir, 0, LOST, at=now + 2)
    _record(run_dir, 2, ValueError("batch of step 3 has 3 columns,\nthe model takes 16"), at=now)
    _record(run_dir, 3, LOST, at=now + 1)
    record = json.loads(failures.failure_path(run_dir, 2).read_text())
    assert record["type"] == "ValueError" and record["message"] == "batch of step 3 has 3 columns,\nthe model takes 16"
    assert record["log"] == str(run_dir / "logs" / "rank2.log") and not record["lost_peer"]
    assert explain(run_dir, "7", [1, None, 1, 1]) == (
        "rank 2 on node2: ValueError: batch of step 3 has 3 columns, the model takes 16 (raised in "
        f"tests/launchers/test_failures.py:{_line_of_raise()}) (log: {run_dir}/logs/rank2.log); ranks 0, 3 failed "
        "after it")


def _line_of_raise() -> int:
    import inspect

    lines, start = inspect.getsourcelines(_raise)
    return start + next(i for i, line in enumerate(lines) if "raise exc" in line)


def test_the_same_error_on_every_rank_is_said_once(run_dir):
    for rank in range(4):
        _record(run_dir, rank, FileNotFoundError("no /data/asr/index.json"), at=100.0 + rank)
    cause = explain(run_dir, "7")
    assert cause.startswith("rank 0 on node1: FileNotFoundError: no /data/asr/index.json (raised in ")
    assert cause.endswith(f"(log: {run_dir}/logs/rank0.log); ranks 1-3 raised the same")


def test_records_of_another_job_or_an_earlier_start_are_not_this_ones(run_dir):
    _record(run_dir, 1, ValueError("from job 6"), job_id="6")
    assert explain(run_dir, "7") is None
    _record(run_dir, 1, ValueError("from an earlier start of job 7"))
    failures.clear(run_dir, 1)  # the rank started again
    assert explain(run_dir, "7") is None


def test_a_rank_killed_by_a_signal_is_named_with_its_host_not_its_peers_lost_connection(run_dir):
    _record(run_dir, 0, LOST)
    cause = explain(run_dir, "7", [1, -9, None, None])
    assert cause == ("rank 1 on node1 was killed by signal 9 (SIGKILL: the out-of-memory killer or a kill -9) "
                     f"(log: {run_dir}/logs/rank1.log); rank 0 failed after it")


# srun's report in job 37's log (tests/slurm/test_slurm_jobs.py: rank 1 of 2 SIGKILLed),
# and what accounting kept of it.
SRUN_KILLED = """\
srun: error: localhost: task 1: Killed
submitit ERROR (2026-11-28 01:30:02,763) - Submitted job triggered an exception
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer
srun: error: localhost: task 0: Exited with exit code 1
srun: Force Terminated StepId=37.0
"""
SACCT_KILLED = "37|FAILED|9:0|0:9|localhost\n37.batch|FAILED|9:0||localhost\n37.0|CANCELLED|0:9||localhost\n"


def test_srun_and_sacct_name_a_killed_task_on_slurm(run_dir):
    ends = srun_report(SRUN_KILLED, 2)
    assert ends.codes == {1: -9, 0: 1} and ends.hosts == {1: "localhost", 0: "localhost"}
    assert sacct_end(SACCT_KILLED, "37") == {"state": "FAILED", "nodes": "localhost", "step_signal": 9}
    _record(run_dir, 0, LOST, job_id="37")
    ends.scheduler, ends.step_signal = "FAILED", 9
    assert explain(run_dir, "37", ends).startswith("rank 1 on node1 was killed by signal 9 (SIGKILL")


def test_a_step_signal_in_accounting_alone_still_names_the_signal(run_dir):
    ends = TaskEnds(scheduler="FAILED", step_signal=9)
    assert explain(run_dir, "7", ends) == (
        "a rank was killed by signal 9 (SIGKILL: the out-of-memory killer or a kill -9; SLURM's accounting of the "
        "job's step, which does not say which rank)")


# Job 51 (tests/slurm/test_multinode.py): rank 1's node, aunode2, frozen and cut off; SLURM
# ended the job NODE_FAIL and srun killed rank 0.
SRUN_NODE_FAIL = """\
srun: error: Node failure on aunode2
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
slurmstepd-aunode1: error: *** JOB 51 ON aunode1 CANCELLED AT 2026-11-28T01:41:18 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***
slurmstepd-aunode1: error: *** STEP 51.0 ON aunode1 CANCELLED AT 2026-11-28T01:41:18 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***
srun: got SIGCONT
srun: forcing job termination
srun: error: aunode1: task 0: Killed
"""
SACCT_NODE_FAIL = ("51|NODE_FAIL|0:0|0:0|aunode[1-2]\n51.batch|CANCELLED|0:15||aunode1\n"
                   "51.0|CANCELLED|0:9||aunode[1-2]\n")


def test_a_lost_node_is_named_with_the_ranks_it_ran_not_the_ranks_slurm_killed_after(tmp_path):
    run = tmp_path / "run"
    (run / "heartbeats").mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps({"world_size": 2}))
    for rank in (0, 1):
        (run / "heartbeats" / f"rank{rank}.json").write_text(json.dumps({"host": f"aunode{rank + 1}"}))
    ends = srun_report(SRUN_NODE_FAIL, 2)
    assert ends.lost_nodes == ["aunode2"] and ends.codes == {0: -9}
    end = sacct_end(SACCT_NODE_FAIL, "51")
    assert end == {"state": "NODE_FAIL", "nodes": "aunode[1-2]", "step_signal": 9}
    ends.scheduler, ends.nodes, ends.step_signal = end["state"], end["nodes"], end["step_signal"]
    assert explain(run, "51", ends) == (f"node aunode2 failed (SLURM: NODE_FAIL): rank 1 ran there "
                                        f"(log: {run}/logs/rank1.log); rank 0 failed after it")
    # Without srun's report (its log on a node's own disk): accounting alone.
    assert explain(run, "51", TaskEnds(scheduler="NODE_FAIL", nodes="aunode[1-2]")) == \
        "a node of the job (aunode[1-2]) failed (SLURM: NODE_FAIL)"


SRUN_OOM = "srun: error: node2: task 3: Out Of Memory\nsrun: error: node1: tasks 0-1: Killed\n"
SACCT_OOM = ("41|OUT_OF_MEMORY|0:125|0:0|node[1-2]\n41.batch|OUT_OF_MEMORY|0:125||node1\n"
             "41.0|OUT_OF_MEMORY|0:125||node[1-2]\n")


def test_a_rank_out_of_memory_on_slurm(run_dir):
    ends = srun_report(SRUN_OOM, 4)
    assert ends.oom == [3] and ends.codes == {0: -9, 1: -9}
    ends.scheduler = sacct_end(SACCT_OOM, "41")["state"]
    assert ends.scheduler == "OUT_OF_MEMORY"
    assert explain(run_dir, "41", ends) == (
        "rank 3 on node2 ran out of memory (SLURM: OUT_OF_MEMORY; launcher.mem_gb is the job's memory) "
        f"(log: {run_dir}/logs/rank3.log); ranks 0-1 failed after it")


def test_a_time_limit_or_a_cancel_is_slurms_word_not_the_ranks_it_killed(run_dir):
    ends = srun_report("slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-11-28T01:41:18 DUE TO TIME LIMIT ***\n"
                       "srun: error: n1: tasks 0-3: Terminated\n", 4)
    ends.scheduler = sacct_end("9|TIMEOUT|0:0|0:0|n1\n9.0|CANCELLED|0:15||n1\n", "9")["state"]
    assert explain(run_dir, "9", ends) == \
        "SLURM ended the job (TIMEOUT): the job reached its time limit (launcher.timeout_min)"
    assert sacct_end("9|CANCELLED by 0|0:0|0:0|n1\n", "9")["state"] == "CANCELLED"


def test_a_crash_in_native_code_is_told_from_its_core_dump(run_dir):
    ends = srun_report("srun: error: node2: task 2: Segmentation fault (core dumped)\n", 4)
    assert ends.codes == {2: -11}
    assert explain(run_dir, "7", ends).startswith("rank 2 on node2 was killed by signal 11 (SIGSEGV: a crash in "
                                                  "native code)")


def test_only_this_attempts_part_of_a_requeued_jobs_log_is_read(run_dir):
    """srun's log is appended across requeues: a node lost in the first attempt is not the
    cause of the second's failure."""
    folder = run_dir / "submitit"
    folder.mkdir()
    first = "srun: error: Node failure on node2\nsrun: error: node1: task 0: Killed\n"
    second = "srun: error: node1: task 1: Killed\n"  # before any task of the attempt ran Python
    (folder / "7_0_log.err").write_text("".join(f"{slurm_records.ATTEMPT_START}: job 7, restart {n}\n{text}"
                                                for n, text in enumerate([first, second])))
    ends = failures.task_ends(run_dir, "slurm", "7", folder, query_scheduler=False)
    assert ends.lost_nodes == [] and ends.codes == {1: -9}
    assert explain(run_dir, "7", ends).startswith("rank 1 on node1 was killed by signal 9")


def test_the_log_followed_while_the_job_runs_gives_this_attempts_task_ends_as_they_come(tmp_path):
    """Rank 0's watchdog reads srun's report every few seconds of a log that also holds
    rank 0's stderr: each read takes only what the log gained, a line still being written
    is taken once whole, and the attempts before this one are not read."""
    log = tmp_path / "7_0_log.err"
    log.write_text(f"{slurm_records.ATTEMPT_START}: job 7, restart 0\nsrun: error: node1: task 1: Killed\n"
                   f"{slurm_records.ATTEMPT_START}: job 7, restart 1\nWARNING rank 0 says something\n")
    tail = slurm_records.SrunLogTail(log)
    assert tail.ends(4).codes == {}  # task 1's end belongs to the first attempt
    with open(log, "a") as handle:
        handle.write("srun: error: node2: task 3: Exited with exit")  # srun is writing it
        handle.flush()
        assert tail.ends(4).codes == {}
        handle.write(" code 1\nmore of rank 0's stderr\nsrun: error: node1: task 1: Out Of Memory\n")
    ends = tail.ends(4)
    assert ends.codes == {3: 1} and ends.oom == [1] and ends.hosts == {3: "node2", 1: "node1"}
    read = tail.offset
    assert read == log.stat().st_size
    with open(log, "a") as handle:
        handle.write("srun: error: Node failure on node2\n")
    ends = tail.ends(4)
    assert ends.codes == {3: 1} and ends.lost_nodes == ["node2"] and tail.offset > read
    log.unlink()  # a log gone (a cleaned folder) keeps what was read
    assert tail.ends(4).codes == {3: 1}


def test_own_errors_are_this_jobs_since_a_time_not_the_lost_peers(run_dir):
    """What the hang detection asks before it requeues: did a rank stop because it raised
    (a requeue would meet the error again) rather than because it froze?"""
    _record(run_dir, 1, ValueError("bad sample"), at=100.0)
    _record(run_dir, 0, LOST, at=101.0)
    _record(run_dir, 2, ValueError("another job's"), job_id="8", at=102.0)
    _record(run_dir, 3, ValueError("an earlier attempt's"), at=50.0)
    assert failures.own_errors(run_dir, "7", since=90.0) == [1]
    assert failures.own_errors(run_dir, "7") == [3, 1]
    assert failures.own_errors(run_dir, "7", since=200.0) == []


def test_a_rendezvous_port_held_by_another_process_is_said_with_how_to_choose_one(run_dir, monkeypatch):
    """torch's own error when rank 0 cannot listen on MASTER_PORT names the port and errno
    only; the cause line adds who may hold it and how to pick another."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        with pytest.raises(dist.DistNetworkError) as caught:
            dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=5))
    failures.record(run_dir, 0, "7", caught.value)
    line = explain(run_dir, "7")
    assert "EADDRINUSE" in line and f"MASTER_PORT={port} is held by another process" in line, line
    assert "launcher.setup=['export MASTER_PORT=N']" in line and "N in 20000-32767" in line, line


def test_a_local_jobs_exit_statuses_come_from_its_controller(run_dir):
    folder = run_dir / "submitit"
    folder.mkdir()
    (folder / "123_exit_codes.json").write_text(json.dumps({"exit_codes": [1, 1, -9, None]}))
    ends = failures.task_ends(run_dir, "local", "123", folder)
    assert ends.codes == {0: 1, 1: 1, 2: -9}
    assert explain(run_dir, "123", ends).startswith("rank 2 on node2 was killed by signal 9")


def test_the_rank_that_died_first_is_named_not_the_peers_its_controller_killed(run_dir):
    """Rank 3 died at start; its peers waited for it until the local controller killed
    them (launchers/local_controller.py): every code is SIGKILL, the order they ended
    and the ranks the controller stopped tell them apart."""
    folder = run_dir / "submitit"
    folder.mkdir()
    (folder / "5_exit_codes.json").write_text(json.dumps(
        {"exit_codes": [-9, -9, -9, -9], "ended": [3, 0, 1, 2], "stopped": [0, 1, 2], "host": "box"}))
    ends = failures.task_ends(run_dir, "local", "5", folder)
    assert list(ends.codes) == [3, 0, 1, 2] and ends.stopped == [0, 1, 2]
    assert explain(run_dir, "5", ends) == (
        f"rank 3 on node2 was killed by signal 9 (SIGKILL: the out-of-memory killer or a kill -9) "
        f"(log: {run_dir}/logs/rank3.log); ranks 0-2 failed after it")
    for rank in range(4):  # no heartbeat written: the controller's host
        (run_dir / "heartbeats" / f"rank{rank}.json").unlink()
    assert explain(run_dir, "5", failures.task_ends(run_dir, "local", "5", folder)).startswith("rank 3 on box was")


def test_a_rank_that_ended_without_a_word_while_its_peers_lost_it(run_dir):
    for rank in (0, 1, 3):
        _record(run_dir, rank, LOST)
    assert explain(run_dir, "7").startswith("rank 2 on node2 ended without an error of its own")
