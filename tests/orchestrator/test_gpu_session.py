"""benchmarks/gpu_session.py: a lent machine's session runs every acceptance check once,
in parts that fit the calls' time, and skips (saying so) a group that could not finish.
Its groups' real runs are rehearsed by tests/rehearsal (each part's dry run)."""

import json
import re
import subprocess
import sys

from benchmarks.gpu_acceptance import CHECKS
from benchmarks.gpu_session import DEFAULT_SECONDS, MARGIN_S, PARTS, Group, main, schedule
from tests.distributed_run import REPO


def test_the_parts_run_every_check_of_the_acceptance_once():
    named = [check for groups in PARTS.values() for group in groups for check in group.checks.split(",")]
    assert sorted(named) == sorted(CHECKS)
    assert set(DEFAULT_SECONDS) == set(PARTS)


def test_a_group_runs_under_its_limit_or_what_is_left_and_is_skipped_below_its_least():
    group = Group("g", "parity", limit_s=300, least_s=100)
    assert schedule(group, 570, 0) == 300
    assert schedule(group, 570, 570 - MARGIN_S - 120) == 120
    assert schedule(group, 570, 570 - MARGIN_S - 99) is None


def test_parity_run_to_its_limit_leaves_the_9b_job_its_time():
    parity, job9b, job2b = PARTS["1"]
    assert (parity.checks, job9b.checks, job2b.checks) == ("parity", "job9b", "job2b")
    assert schedule(job9b, DEFAULT_SECONDS["1"], parity.limit_s) is not None


def test_a_call_too_short_for_its_groups_skips_them_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert main(["2", "--dry-run", "--seconds", "70"]) == 0
    session = json.loads((tmp_path / "session.json").read_text())
    assert [g["group"] for g in session["groups"]] == ["throughput", "default", "checks"]
    assert all("skipped" in g and "rows" not in g for g in session["groups"]), session
    # the seconds left are counted down by the wall clock: 69 on a machine busy at the start
    left = re.search(r"^throughput: skipped, (\d+) s left, it needs 150 s$", capsys.readouterr().out, re.M)
    assert left and 60 <= int(left.group(1)) <= 70, left
    # a lent machine returns at most eight files: the session writes two (and two per profiled group)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session.json", "session.log"]


def test_the_session_runs_before_the_kit_is_installed():
    """Standard library only: nothing of the kit (torch, the project's dependencies) is imported."""
    code = ("import sys; import benchmarks.gpu_session; "
            "print(sorted(m for m in ('torch', 'numpy', 'omegaconf', 'orchestrator') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.strip() == "[]"


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a killed orphan may wait as a zombie for its reaper


def test_a_group_at_its_limit_goes_with_what_it_started_in_sessions_of_their_own(tmp_path):
    """As `audiollm train` starts its job's controller: a grandchild in a new session,
    which a kill of the group's process alone would leave holding the GPU."""
    from benchmarks.gpu_session import run_bounded

    pid_file = tmp_path / "grandchild.pid"
    child = ("import subprocess, sys, time; "
             "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
             f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)")
    with open(tmp_path / "log", "w") as log:
        assert run_bounded([sys.executable, "-c", child], 3, {}, log) == 124
    grandchild = int(pid_file.read_text())
    assert not _alive(grandchild)
    with open(tmp_path / "log", "w") as log:  # within its limit: its own exit
        assert run_bounded([sys.executable, "-c", "raise SystemExit(3)"], 30, {}, log) == 3


def test_the_groups_write_where_a_disk_has_the_most_room_never_in_memory(tmp_path):
    """A 9B row keeps two 20 GB checkpoints: never on a tmpfs (the host memory the jobs
    need), else where most is free; the record says each candidate's room and kind."""
    import shutil
    from pathlib import Path

    from benchmarks.gpu_session import _filesystem, scratch_root

    in_memory = Path("/dev/shm") / f"audiollm-test-{tmp_path.name}"
    try:
        assert _filesystem(in_memory.parent.resolve() / "x") == "tmpfs"
        disk = tmp_path / "disk"
        chosen, facts = scratch_root([in_memory, disk])
        assert chosen == disk and disk.is_dir() and in_memory.is_dir()
        assert facts[str(in_memory)][1] == "tmpfs" and facts[str(disk)][1] != "tmpfs", facts
        assert all(free >= 0 for free, _ in facts.values())
        # between two disks, the roomier
        other = tmp_path / "other"
        chosen, facts = scratch_root([disk, other])
        assert facts[str(chosen)][0] == max(free for free, _ in facts.values())
    finally:
        shutil.rmtree(in_memory, ignore_errors=True)


def test_a_failed_group_keeps_the_end_of_its_output_in_the_record(tmp_path):
    """The session's folder may not come back from a lent machine (a rehearsal removes its
    own): what a failed group said last is in session.json (and main prints it)."""
    import shutil

    from benchmarks.gpu_session import Session

    session = Session(tmp_path, "1", 60, {}, None)
    shutil.rmtree(session.scratch)
    session.scratch = tmp_path
    entry = session.run(Group("bogus", "no_such_check", 60, 1), 60, dry_run=True, corpus=tmp_path / "no corpus")
    assert entry["exit"] == 2
    assert entry["log_tail"][-1].startswith("gpu_acceptance.py: error: --only no_such_check: unknown no_such_check")
    assert json.loads((tmp_path / "session.json").read_text())["groups"][0]["log_tail"] == entry["log_tail"]
