"""The real trainer on a real multi-node SLURM cluster (tests/slurm/start_cluster.sh: each
node a network namespace with its own hostname and address; fixture `slurm_nodes`):
ranks on different nodes train exactly as on one machine, a USR2 requeue across nodes and
then a frozen rank's requeue of the same job resume exactly in the same W&B run, and a node
that dies mid-run (its link down, its processes frozen: no TCP reset, no signal) is
detected by SLURM, the job requeued onto live nodes and resumed from its last checkpoint
with the uninterrupted run's losses.

Each figure the note of a change quotes goes to the session's `measured` section (fixture `measured`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launchers.prepare import prepare_only
from launchers.status import cancel, status
from launchers.submit import RunActive, ensure_not_active
from launchers.train import train
from orchestrator.plan.rundir import read_json, read_metrics
from tests.distributed_run import REPO
from tests.launchers.helpers import launches, logs_tail, losses, rank_pids, wait_for_end, wait_for_step, wait_until
from tests.slurm.runs import JOB_TIMEOUT, preempt_and_wait_for_resume, restarted_or_ended, slurm_run, wandb_runs
from tests.train.audiollm_runs import make_corpus, train_overrides

pytestmark = [pytest.mark.slurm, pytest.mark.multiprocess]

ITERS = 24
SIGNAL_AFTER = 2
SAVE_INTERVAL = 4  # the node-death run resumes from its last periodic checkpoint
TP2_ACROSS_NODES = ["launcher.nodes=2", "parallel.tp=2"]  # one rank per node
ASYNC_SAVE = "train.async_save=true"  # as the SLURM recipes
PP2_ACROSS_NODES = ["launcher.nodes=2", "parallel.pp=2", "model.adapter.ctc_weight=0"]  # CTC needs pp=1


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("tones"))


@pytest.fixture(scope="module")
def nodes_env(slurm_nodes):
    """SLURM_CONF of the multi-node cluster for the module's submissions and queries."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(slurm_nodes))
        yield slurm_nodes


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("multinode")


def _on_nodes(root, corpus, name, layout, *extra):
    return slurm_run(root, corpus, f"run.name={name}", *layout, *extra, ranks=1, iters=ITERS)


def _on_one_machine(root, corpus, name, layout):
    """The same layout as one local job of two processes on this machine."""
    one_machine = ["launcher.nodes=1" if o == "launcher.nodes=2" else o for o in layout]
    return ["launcher.accelerator=cpu", "launcher.gpus_per_node=2", "launcher.wait=true", *train_overrides(corpus),
            f"train.iters={ITERS}", f"run.output_root={root}", f"run.name={name}", *one_machine]


def _hosts(run_dir) -> list[str]:
    text = "".join((run_dir / "logs" / f"rank{r}.log").read_text() for r in (0, 1))
    return sorted(set(re.findall(r"\] rank \d+/2 pid \d+ job \S+ on (\S+)", text)))


@pytest.fixture(scope="module")
def tp2_reference(nodes_env, corpus, root):
    """TP=2 with one rank per node, submitted first, and the same layout on one machine
    trained while it runs."""
    assert train(_on_nodes(root, corpus, "tp2_nodes", TP2_ACROSS_NODES)) == 0
    run_dir = root / "tiny_cpu" / "tp2_nodes"
    submitted = launches(run_dir)[0]["submitted_at"]
    assert train(_on_one_machine(root, corpus, "tp2_local", TP2_ACROSS_NODES)) == 0
    wait_for_step(run_dir, 1, timeout=JOB_TIMEOUT)
    first_step = min(m["time"] for m in read_metrics(run_dir))
    assert wait_for_end(run_dir, timeout=JOB_TIMEOUT)["state"] == "COMPLETED"
    return run_dir, root / "tiny_cpu" / "tp2_local", first_step - submitted


def test_tensor_parallel_ranks_on_two_nodes_train_as_on_one_machine(tp2_reference, measured):
    run_dir, local_dir, submit_to_first_step = tp2_reference
    assert read_json(run_dir / "plan.json")["tp"] == 2
    assert len(_hosts(run_dir)) == 2 and all(h.startswith("aunode") for h in _hosts(run_dir))
    assert sorted(losses(run_dir)) == list(range(1, ITERS + 1))
    assert losses(run_dir) == losses(local_dir)  # bitwise: the same sums in the same order
    measured(f"2 nodes, submit -> first step {submit_to_first_step:.1f} s")


def test_pipeline_stages_on_two_nodes_train_as_on_one_machine(nodes_env, corpus, root):
    assert train(_on_nodes(root, corpus, "pp2_nodes", PP2_ACROSS_NODES)) == 0
    run_dir = root / "tiny_cpu" / "pp2_nodes"
    assert train(_on_one_machine(root, corpus, "pp2_local", PP2_ACROSS_NODES)) == 0
    assert wait_for_end(run_dir, timeout=JOB_TIMEOUT)["state"] == "COMPLETED"
    assert read_json(run_dir / "plan.json")["pp"] == 2 and len(_hosts(run_dir)) == 2
    assert sorted(losses(run_dir)) == list(range(1, ITERS + 1))
    assert losses(run_dir) == losses(root / "tiny_cpu" / "pp2_local")


def _netns_pids(node: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True, timeout=30).stdout
    return [int(p) for p in out.split()]


def _signal(pids, sig: str) -> None:
    if pids:
        subprocess.run(["kill", f"-{sig}", *map(str, pids)], capture_output=True, timeout=30)


def test_a_dead_node_is_replaced_and_the_job_resumes_with_the_same_losses(tp2_reference, nodes_env, corpus, root,
                                                                       capsys, measured):
    """One node of a running 2-node job dies: its link goes down and every process in it
    (slurmd, the rank) freezes, as a machine that hangs. SLURM notices after
    SlurmdTimeout, requeues the job onto the two live nodes, and it resumes from its
    last periodic checkpoint to finish with the uninterrupted run's losses."""
    ref_dir = tp2_reference[0]
    assert train(_on_nodes(root, corpus, "tp2_dead_node", TP2_ACROSS_NODES,
                                    f"train.save_interval={SAVE_INTERVAL}")) == 0
    run_dir = root / "tiny_cpu" / "tp2_dead_node"
    job_id = launches(run_dir)[0]["job_ids"][0]
    wait_for_step(run_dir, SAVE_INTERVAL + 1, timeout=JOB_TIMEOUT)
    nodelist = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    nodes = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                           timeout=30).stdout.split()
    assert len(nodes) == 2, nodes
    dead = nodes[-1]
    frozen = _netns_pids(dead)
    subprocess.run(["ip", "link", "set", f"auveth{dead.removeprefix('aunode')}", "down"], check=True, timeout=30)
    _signal(frozen, "STOP")
    died = time.time()
    try:
        state = wait_until(lambda: restarted_or_ended(run_dir), JOB_TIMEOUT, "the job requeued after the node died",
                           [run_dir])
        assert state.get("attempt") == 2, state
        done_before = max(m["step"] for m in read_metrics(run_dir))
        wait_for_step(run_dir, done_before + 1, timeout=JOB_TIMEOUT)
        first_after = time.time()
        assert wait_for_end(run_dir, timeout=JOB_TIMEOUT)["state"] == "COMPLETED"
    finally:  # the node comes back for the tests after this one
        subprocess.run(["ip", "link", "set", f"auveth{dead.removeprefix('aunode')}", "up"], timeout=30)
        _signal(frozen, "CONT")
        subprocess.run(["scontrol", "update", f"nodename={dead}", "state=resume"], capture_output=True, timeout=30)
    assert dead not in _hosts_of_attempt(run_dir, 2)
    log = (run_dir / "logs" / "rank0.log").read_text()
    resumed = re.findall(r"resumed from \S+ at step (\d+)", log)
    assert resumed and int(resumed[-1]) % SAVE_INTERVAL == 0, log[-3000:]
    assert losses(run_dir) == losses(ref_dir)
    capsys.readouterr()
    assert status(run_dir) == 0
    story = capsys.readouterr().out
    (attempt,) = [line for line in story.splitlines() if "attempt 1 on" in line]
    assert f"attempt 1 on {nodelist} " in attempt and "a node failed" in attempt, story
    assert f"(steps kept: 1..{resumed[-1]})" in attempt and "requeues  1" in story, story
    measured(f"node {dead} dead -> first step on live nodes {first_after - died:.1f} s "
             f"(resumed from step {resumed[-1]})")


def test_status_names_a_lost_node_and_the_rank_it_ran_when_slurm_does_not_requeue(nodes_env, root, monkeypatch):
    """A 2-node job of the launchers' minimal job that SLURM may not requeue (`scontrol
    update requeue=0`, as `sbatch --no-requeue` or a cluster without requeues): its second
    node dies as above. The job ends NODE_FAIL and `audiollm status` names the node and
    the rank that ran there, from srun's report in the job's log and accounting; not rank
    0, which srun killed after it (before, status printed no cause at all)."""
    from tests.launchers.helpers import status_cause, tiny_overrides
    from tests.slurm.runs import SLURM

    monkeypatch.setenv("AUDIOLLM_MINIMAL_STEP_DELAY_S", "0.25")
    assert train(["+recipe=tiny_cpu", *tiny_overrides(root, "run.name=node_lost", ranks=1, iters=2000), *SLURM,
                  "launcher.nodes=2", "optim.micro_batch_size=8"]) == 0  # one rank on each node
    run_dir = root / "tiny_cpu" / "node_lost"
    job_id = launches(run_dir)[0]["job_ids"][0]
    subprocess.run(["scontrol", "update", f"jobid={job_id}", "requeue=0"], check=True, timeout=30)
    wait_for_step(run_dir, 2, timeout=JOB_TIMEOUT)
    (dead,) = re.findall(r"\] rank 1/2 pid \d+ job \S+ on (\S+)", (run_dir / "logs" / "rank1.log").read_text())
    frozen = _netns_pids(dead)
    subprocess.run(["ip", "link", "set", f"auveth{dead.removeprefix('aunode')}", "down"], check=True, timeout=30)
    _signal(frozen, "STOP")
    expected = (f"node {dead} failed (SLURM: NODE_FAIL): rank 1 ran there (log: {run_dir}/logs/rank1.log); "
                "rank 0 failed after it")
    try:
        assert wait_for_end(run_dir, timeout=JOB_TIMEOUT)["state"] == "NODE_FAIL"
        # srun reports rank 0 killed once the job's step has ended, a few seconds after the job.
        deadline, cause = time.time() + 60, None
        while cause != expected and time.time() < deadline:
            cause = status_cause(run_dir)
            time.sleep(1)
        assert cause == expected
    finally:  # the node comes back for the tests after this one
        subprocess.run(["ip", "link", "set", f"auveth{dead.removeprefix('aunode')}", "up"], timeout=30)
        _signal(frozen, "CONT")
        subprocess.run(["scontrol", "update", f"nodename={dead}", "state=resume"], capture_output=True, timeout=30)


RECORDING_ENTRY = "launcher.entry=tests.train.consumed.main"  # the job's entry, logging the samples it trains on
# The auxiliary CTC loss amplifies the reduction-order differences between TP 2 and DP 2
# about tenfold in one step (9e-5 against 7e-6 relative): the bounds below are set without it.
NO_CTC = "model.adapter.ctc_weight=0"


def _not_active(run_dir) -> bool:
    try:
        ensure_not_active(run_dir)
    except RunActive:
        return False
    return True


def test_a_two_node_run_continues_on_one_node_and_back_reading_every_sample_once(nodes_env, corpus, root, capsys,
                                                                                 measured):
    """Data parallel on two nodes (one rank each), cancelled after step 6; continued on one
    node at TP 2 (DP 1: its one data-parallel rank reads both canonical nodes), cancelled
    after step 14; continued on two nodes again to the end. Against the same DP-2 run
    straight on this machine: every step trains on the same samples (so none of the
    epoch is lost or read twice), the steps before the first change bit for bit, the rest
    within fp32 reduction order. In the last phase rank 1, held to a tenth of a core
    from its first steps to the end, is named a straggler."""
    straight_dir, run_dir = root / "tiny_cpu" / "dp2_straight", root / "tiny_cpu" / "dp2_elastic"
    said = []
    for nodes, layout, stop_after in ((2, [], 6), (1, ["launcher.gpus_per_node=2", "parallel.tp=2"], 14),
                                      (2, [], None)):
        capsys.readouterr()
        assert train(_on_nodes(root, corpus, "dp2_elastic", [f"launcher.nodes={nodes}"], RECORDING_ENTRY,
                                        NO_CTC, "train.log_interval=4", *layout)) == 0
        said.append(capsys.readouterr().out)
        launch = len(said) - 1  # the state.json of an earlier attempt says nothing of this one
        wait_until(lambda: (read_json(run_dir / "state.json") or {}).get("launch") == launch, JOB_TIMEOUT,
                   f"launch {launch} to start", [run_dir])
        if stop_after is None:
            slowed = _slowed_by_a_cpu_quota(run_dir, 1, attempt=3)
            break
        if not (straight_dir / "plan.json").exists():  # the reference, beside the first phase
            local = [o for o in _on_one_machine(root, corpus, "dp2_straight", ["launcher.nodes=2", NO_CTC])
                     if o != "launcher.wait=true"]
            assert train([*local, "launcher.wait=false", RECORDING_ENTRY]) == 0
        wait_for_step(run_dir, stop_after, timeout=JOB_TIMEOUT)
        assert cancel(run_dir) == 0
        wait_until(lambda: _not_active(run_dir), JOB_TIMEOUT, "the cancelled job to end", [run_dir])
        # Stopped at a step boundary with a checkpoint (W&B's service, which SLURM's SIGTERM
        # also ends, must not turn that into a failure).
        state = read_json(run_dir / "state.json")
        assert state["state"] == "PREEMPTED", f"{state}\n{logs_tail([run_dir])}"
    assert wait_for_end(run_dir, timeout=JOB_TIMEOUT)["state"] == "COMPLETED"
    assert wait_for_end(straight_dir, timeout=JOB_TIMEOUT)["state"] == "COMPLETED"
    assert "continues at another size: TP 1 PP 1 CP 1 DP 2 -> TP 2 PP 1 CP 1 DP 1" in said[1], said[1]
    assert "continues at another size: TP 2 PP 1 CP 1 DP 1 -> TP 1 PP 1 CP 1 DP 2" in said[2], said[2]
    log = (run_dir / "logs" / "rank0.log").read_text()
    resumed = [int(step) for step in re.findall(r"resumed from \S+ at step (\d+)", log)]
    assert len(resumed) == 2 and resumed[0] >= 6 and resumed[1] >= 14, log[-3000:]
    assert log.count("continuing at another size") == 2
    from tests.train.consumed import consumed

    assert consumed(run_dir / "consumed") == consumed(straight_dir / "consumed")
    straight, continued = losses(straight_dir), losses(run_dir)
    assert sorted(continued) == sorted(straight) == list(range(1, ITERS + 1))
    assert [continued[s] for s in range(1, resumed[0] + 1)] == [straight[s] for s in range(1, resumed[0] + 1)]
    rel = {s: abs(continued[s] / straight[s] - 1) for s in straight}
    # After the first change only the order of fp32 sums differs (TP splits the matmuls,
    # DP 1 accumulates both micro-batches where DP 2 all-reduces them), in the first step's
    # loss (the weights carried over) and the second's (the Adam moments carried over):
    # 7e-5 relative at most, measured here. Weights or Adam moments lost in the reshard
    # move those two steps by 1e-2 or more: 3e-4 tells them apart. Adam, whose step does
    # not shrink with the gradient, then grows the differences (2e-4 by the end here):
    # 1e-2 for the run as a whole. (A lost or repeated sample is caught exactly, above.)
    # Rank 1, held to CPU_SHARE of a core from about step 17 to the end, is named a straggler,
    # alone, in each report (train.log_interval 4) of steps it was slowed in throughout.
    # (Elsewhere a 20 % excess can come from this 2-core machine, shared by both nodes and
    # the reference run.)
    rows = {m["step"]: m for m in read_metrics(run_dir)}
    reports = [step for step in (20, 24) if step - 3 >= slowed[0] and step <= slowed[1]]
    assert reports, slowed
    assert all(rows[step].get("stragglers") == [1] for step in reports), \
        (slowed, [(s, rows[s].get("stragglers")) for s in sorted(rows)])
    first_change = max(rel[resumed[0] + 1], rel[resumed[0] + 2])
    assert first_change <= 3e-4, rel
    assert max(rel.values()) <= 1e-2, rel
    measured(f"DP 2 on 2 nodes -> TP 2 on 1 node (from step {resumed[0]}) -> DP 2 on 2 nodes (from step "
             f"{resumed[1]}): the same samples; the two steps after the first change within {first_change:.1e}, "
             f"the run within {max(rel.values()):.1e} relative of the straight run")
    measured(f"rank 1 held to {CPU_SHARE:g} of a core from step {slowed[0]}: named a straggler in the reports of "
             + ", ".join(f"step {s} (+{100 * rows[s]['straggler/rank1_over_median']:.0f}% over the median)"
                         for s in reports))


CPU_SHARE = 0.1  # of one core, for the slowed rank


def _cpu_controller() -> Path:
    """Where this machine's cgroup CPU controller takes a new group: cgroup v2 (cpu.max)
    or v1's cpu hierarchy (cpu.cfs_quota_us)."""
    unified = Path("/sys/fs/cgroup")
    controllers = unified / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return unified
    legacy = unified / "cpu"
    assert (legacy / "cpu.cfs_quota_us").exists(), "the straggler check needs a cgroup CPU controller (v1 or v2)"
    return legacy


def _ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _slowed_by_a_cpu_quota(run_dir, rank: int, attempt: int) -> tuple[int, int]:
    """Once the `attempt`-th start of the run has logged a step, put its rank `rank` in a
    cgroup allowed CPU_SHARE of one core until its process ends: a slow machine, slowed
    in whatever the rank computes (its data, forward/backward, optimizer) and not in
    its waits for the others, which use no CPU. (Stopping it with SIGSTOP cycles instead
    lands the stops in its waits too, wherever the second of two cores' load puts them.)
    Returns (the first step slowed from its start, the last step logged)."""
    wait_until(lambda: len(rank_pids(run_dir, rank)) >= attempt, JOB_TIMEOUT, f"start {attempt} of rank {rank}",
               [run_dir])
    pid = rank_pids(run_dir, rank)[attempt - 1]
    def last_step():
        return max(m["step"] for m in read_metrics(run_dir))

    wait_for_step(run_dir, last_step() + 1, timeout=JOB_TIMEOUT)  # (a resume starts past the logged steps)
    begun = last_step()  # step begun + 1 may be under way: slowed only in part
    controller = _cpu_controller()
    group = controller / f"audiollm-test-slow-rank-{pid}"
    group.mkdir()
    try:
        period = 100_000  # microseconds
        if controller.name == "cpu":
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(int(CPU_SHARE * period)))
        else:
            (group / "cpu.max").write_text(f"{int(CPU_SHARE * period)} {period}")
        (group / "cgroup.procs").write_text(str(pid))  # every thread of the process
        wait_until(lambda: _ended(pid), JOB_TIMEOUT, f"rank {rank} (pid {pid}) to end", [run_dir])
    finally:
        with contextlib.suppress(OSError):  # the process, if alive, goes back to the root group
            (controller / "cgroup.procs").write_text(str(pid))
        for _ in range(50):  # a group is removable once its last task has gone
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.1)
    return begun + 2, last_step()


HANG_TIMEOUT = 15  # train.hang_timeout, seconds


def test_usr2_and_then_a_frozen_rank_requeue_a_two_node_job_that_resumes_exactly_in_one_wandb_run(
        tp2_reference, nodes_env, corpus, root, capsys, measured):
    """Two requeues of one running 2-node job (one job for both: a job's start and its 24
    steps fewer; docs/project.md). First USR2, SLURM's preemption / time-limit warning: the
    job saves in the background (the SLURM recipes' setting), publishes that checkpoint before
    it exits for its requeue, and resumes from it. Then, once the second attempt has
    written a periodic checkpoint of its own, one rank is frozen (SIGSTOP: its own threads
    stop too; its node stays healthy, so SLURM sees nothing). The other rank's watchdog
    finds no progress for train.hang_timeout, logs its stacks, names the frozen rank, and
    requeues the job, which resumes from that checkpoint. The run ends with the
    uninterrupted run's losses, in one W&B run over its three attempts, and `audiollm
    status` tells both requeues and the hang's cause."""
    ref_dir = tp2_reference[0]
    assert train(_on_nodes(root, corpus, "tp2_requeues", TP2_ACROSS_NODES, ASYNC_SAVE,
                           f"train.save_interval={SAVE_INTERVAL}", f"train.hang_timeout={HANG_TIMEOUT}")) == 0
    run_dir = root / "tiny_cpu" / "tp2_requeues"
    job_id = launches(run_dir)[0]["job_ids"][0]
    done_before, resume_s = preempt_and_wait_for_resume(run_dir, job_id, SIGNAL_AFTER)
    assert read_json(run_dir / "state.json").get("requeue_causes") == {}  # a preemption is no failure to explain
    # The second attempt past its first periodic checkpoint, then rank 1 (its newest process) frozen.
    wait_for_step(run_dir, (done_before // SAVE_INTERVAL + 1) * SAVE_INTERVAL + 1, timeout=JOB_TIMEOUT)
    pid = rank_pids(run_dir, 1)[-1]
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.time()
    wait_until(lambda: (read_json(run_dir / "state.json") or {}).get("requeue_causes"), JOB_TIMEOUT,
               "the hang to be detected", [run_dir])
    detected = time.time() - frozen_at
    state = wait_until(lambda: restarted_or_ended(run_dir, attempt=3), JOB_TIMEOUT, "the job requeued after the hang",
                       [run_dir])
    assert state.get("attempt") == 3, state
    wait_for_step(run_dir, max(m["step"] for m in read_metrics(run_dir)) + 1, timeout=JOB_TIMEOUT)
    first_step_after = time.time() - frozen_at
    assert wait_for_end(run_dir, timeout=JOB_TIMEOUT)["state"] == "COMPLETED"
    assert read_json(run_dir / "state.json")["requeues"] == 2
    assert losses(run_dir) == losses(ref_dir)
    run_id = (run_dir / "wandb_id").read_text().strip()
    assert [name.rsplit("-", 1)[-1] for name in wandb_runs(run_dir)] == [run_id] * 3
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "[watchdog] rank 0: no progress for" in log and "(most recent call first):" in log  # its stacks
    assert list(state["requeue_causes"]) == ["2"], state["requeue_causes"]  # the hang's alone, under its attempt
    cause = state["requeue_causes"]["2"]
    assert re.search(rf"rank 1 \(pid {pid} on aunode\d\): no heartbeat for \d+ s, frozen or dead", cause), cause
    assert "rank 0" not in cause.partition(";")[2], cause  # only the frozen rank is named
    assert cause.startswith("hang: no progress for") and f"(bound {HANG_TIMEOUT} s)" in cause, cause
    capsys.readouterr()
    assert status(run_dir) == 0
    story = capsys.readouterr().out
    attempts = [line for line in story.splitlines() if re.search(r"attempt \d on ", line)]
    assert "requeues  2" in story and len(attempts) == 2, story
    assert "requeued (preemption or time-limit signal" in attempts[0] and "hang: no progress" in attempts[1], story
    measured(f"2 nodes, USR2 -> first step after requeue {resume_s:.1f} s")
    measured(f"rank 1 frozen (SIGSTOP) -> hang detected and the job requeued {detected:.1f} s later, "
             f"first step after the requeue {first_step_after:.1f} s (train.hang_timeout {HANG_TIMEOUT} s)")


def test_a_rank_that_raises_while_its_peers_wait_fails_the_job_at_once_and_ends_every_task(nodes_env, root,
                                                                                          monkeypatch, measured):
    """A 2-node job of the launchers' minimal job, 4 ranks: rank 0 raises at step 3 while
    ranks 1-3 wait for it without an error, as a NCCL collective waits for a peer that is
    gone (a stand-in: gloo's would fail on the closed connection). Rank 1's hang detection
    finds rank 0 stopped, and its error recorded: no hang, so no requeue (it would meet the
    error again). The job ends FAILED, rank 1 ending every task of the step: ranks 2-3,
    which detected the same stall but do not act, would otherwise wait REQUEUE_GRACE_S
    more. `audiollm status` names rank 0's own error."""
    from launchers.watchdog import REQUEUE_GRACE_S
    from tests.launchers.helpers import status_cause, tiny_overrides
    from tests.slurm.runs import SLURM

    monkeypatch.setenv("AUDIOLLM_MINIMAL_FAIL", "0:3")
    monkeypatch.setenv("AUDIOLLM_MINIMAL_PEERS_WAIT", "1")
    assert train(["+recipe=tiny_cpu", *tiny_overrides(root, "run.name=raised_first", ranks=2, iters=12), *SLURM,
                  "launcher.nodes=2", "optim.micro_batch_size=4", f"train.hang_timeout={HANG_TIMEOUT}"]) == 0
    run_dir = root / "tiny_cpu" / "raised_first"
    (job_id,) = launches(run_dir)[0]["job_ids"]
    wait_until(lambda: (run_dir / "logs" / "failure_rank0.json").exists(), JOB_TIMEOUT, "rank 0's error", [run_dir])
    raised_at = read_json(run_dir / "logs" / "failure_rank0.json")["time"]
    wait_until(lambda: not subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True,
                                          timeout=30).stdout.strip(), JOB_TIMEOUT, "the job to leave the queue",
               [run_dir])
    ended = time.time() - raised_at
    assert wait_for_end(run_dir, timeout=60)["state"] == "FAILED"
    state = read_json(run_dir / "state.json")
    assert state["attempt"] == 1 and not state["requeues"], state
    log = (run_dir / "logs" / "rank1.log").read_text()
    assert "[watchdog] rank 1: no progress for" in log and "not a hang: rank 0 on aunode" in log, log[-3000:]
    assert f"ending the tasks of step {job_id}." in log, log[-3000:]
    assert ended < HANG_TIMEOUT + REQUEUE_GRACE_S, (ended, logs_tail([run_dir]))
    cause = status_cause(run_dir)
    assert re.fullmatch(r"rank 0 on aunode\d: ValueError: batch of step 3 has 3 columns, the model takes 16 "
                        r"\(AUDIOLLM_MINIMAL_FAIL\) \(raised in tests/launchers/minimal_job\.py:\d+\) "
                        + re.escape(f"(log: {run_dir}/logs/rank0.log)") + r"; ranks? 1[-\d, ]* failed after it",
                        cause), cause
    measured(f"rank 0 raised while 3 ranks waited as under NCCL (train.hang_timeout {HANG_TIMEOUT} s): "
             f"the job failed and left the queue {ended:.1f} s later, not requeued")


def _hosts_of_attempt(run_dir, attempt: int) -> list[str]:
    """Hosts of the ranks started by the given attempt (each attempt logs its ranks anew)."""
    hosts = []
    for r in (0, 1):
        starts = re.findall(r"\] rank \d+/2 pid \d+ job \S+ on (\S+)", (run_dir / "logs" / f"rank{r}.log").read_text())
        hosts.append(starts[attempt - 1])
    return hosts


def _sbatch_options(script: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --"):].partition("=")[::2] for line in script.splitlines()
                if line.startswith("#SBATCH --"))


def test_the_gpu_recipe_is_accepted_and_started_and_stops_in_one_line_without_cuda(nodes_env, corpus, root, capsys):
    """The 4-node GPU recipe, shrunk to 2 nodes x 2 GPUs (the cluster's fake GPUs: device
    files the scheduler counts) and to CPUs and memory these nodes have: SLURM accepts the
    sbatch options the full recipe renders and starts the job; without a CUDA device the
    job stops at once with one line naming the node."""
    recipe = ["+recipe=gemma2_whisper_tp4pp2", f"run.output_root={root}"]
    fit = ["launcher.cpus_per_task=1"]  # the CPUs these nodes have
    data = [f"data.train=[{{name:tones_a,path:'{corpus / 'train' / 'tones_a'}'}}]",
            f"data.tokenizer='{corpus / 'tokenizer'}'", "data.audio_token='<audio>'"]  # a submission needs data
    shrunk = [*recipe, "launcher.nodes=2", "launcher.gpus_per_node=2", "parallel.tp=2", "parallel.pp=2", *fit,
              *data, "run.name=gpu_recipe"]
    capsys.readouterr()
    assert train([*recipe, "launcher.dry_run=true", "run.name=full"]) == 0
    full = _sbatch_options(capsys.readouterr().out)
    assert train([*shrunk, "launcher.dry_run=true"]) == 0
    small = _sbatch_options(capsys.readouterr().out)
    assert full["nodes"] == "4" and full["gpus-per-node"] == "8" and small["gpus-per-node"] == "2"
    resized = {"nodes", "gpus-per-node", "ntasks-per-node", "cpus-per-task", "mem", "job-name", "output", "error"}
    assert set(full) == set(small) and {k: v for k, v in full.items() if k not in resized} == \
        {k: v for k, v in small.items() if k not in resized}
    assert train(shrunk) == 0
    run_dir = next(root.glob("*/gpu_recipe"))
    info = wait_for_end(run_dir, timeout=JOB_TIMEOUT)
    assert info["state"] == "FAILED", info
    assert (info["error"] or "").strip().splitlines()[-1].startswith("RuntimeError: no CUDA device on aunode"), info
    log = (run_dir / "logs" / "rank0.log").read_text()
    assert "CUDA_VISIBLE_DEVICES='0,1'" in log, log[-2000:]  # the scheduler gave the task its 2 fake GPUs


def _on_node(node: str, argv: list[str]) -> list[str]:
    """argv run as on that node: its network namespace, its hostname, its hosts file (as
    tests/slurm/start_cluster.sh starts the node's slurmd), so that torchrun finds itself
    in the rendezvous endpoint's name."""
    return ["unshare", "--mount", "--uts", "--propagation", "slave", "--", "nsenter", f"--net=/run/netns/{node}",
            "--", "sh", "-c", 'mount --bind "/etc/netns/$1/hosts" /etc/hosts && hostname "$1" && shift && exec "$@"',
            "sh", node, *argv]


def _prepared(root, corpus, name) -> Path:
    assert prepare_only(_on_nodes(root, corpus, name, TP2_ACROSS_NODES)) == 0
    return root / "tiny_cpu" / name


def test_srun_inside_an_allocation_and_torchrun_on_each_node_run_the_same_job(tp2_reference, nodes_env, corpus, root):
    """Outside submitit: `audiollm prepare` writes the run directory; `salloc` + `srun`
    starts the ranks (launchers/by_hand.py, as `audiollm prepare` prints) with SLURM's
    variables only (RANK, WORLD_SIZE, MASTER_ADDR from SLURM_PROCID, SLURM_NTASKS,
    SLURM_JOB_NODELIST), and `torchrun --nnodes=2` started in each node's namespace starts
    them with torchrun's; both give the submitted run's losses."""
    ref_dir = tp2_reference[0]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("RANK", None)
    srun_dir = _prepared(root, corpus, "tp2_srun")
    proc = subprocess.run(["salloc", "-N2", "--ntasks-per-node=1", "--cpus-per-task=1", "--mem=4G", "--time=10",
                           "srun", sys.executable, "-m", "launchers.by_hand", str(srun_dir)],
                          capture_output=True, text=True, timeout=JOB_TIMEOUT, env=env, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert losses(srun_dir) == losses(ref_dir)
    torchrun_dir = _prepared(root, corpus, "tp2_torchrun")
    procs = [subprocess.Popen(_on_node(node, [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                                              "--nproc-per-node=1", "--rdzv-backend=c10d",
                                              "--rdzv-endpoint=aunode1:29513", "--rdzv-id=tp2", "-m",
                                              "launchers.by_hand", str(torchrun_dir)]),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
             for node in ("aunode1", "aunode2")]
    try:
        outputs = [p.communicate(timeout=JOB_TIMEOUT)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    assert losses(torchrun_dir) == losses(ref_dir)
