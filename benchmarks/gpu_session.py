"""A lent GPU machine's session: the acceptance's rows in the order they matter, inside
the time the call has.

Run from the root of a copy of this checkout that carries .whl/kit, .whl/demo and
.whl/espeak (47 MiB with the checkout, under a call's 64): docs/gpu-machines.md says how a
connected machine makes them. It installs the kit once (.kit-site stays
on a machine kept between calls), then runs the part's groups of checks one after another,
each under its own limit and never past `--seconds` from its start: a group that would not
have its least useful time left is skipped and said so. Every row measured is kept in $OUT
(default gpu-out) as it comes (the Session's two files).

    python3 benchmarks/gpu_session.py 1 --seconds 570   # parity, the 9B job, the 2b job
    python3 benchmarks/gpu_session.py 2 --seconds 240   # against HF + PEFT, README's first command, the checks
    python3 benchmarks/gpu_session.py 3                 # the default recipe's job rows

A machine lent for 15 minutes, its start included, holds part 1 and what is left of part 2:
give the second call `--seconds` of the device time left, less a minute for the transfers.
Standard library only: it runs before the kit is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: benchmarks/ is on the path, not the repository
    sys.path.insert(0, str(REPO))
from benchmarks import espeak_kit  # noqa: E402  (standard library only, like this file)
from benchmarks.gpu_acceptance import Table  # noqa: E402  (its module level is the standard library too)

DEMO = ".whl/demo"  # `audiollm data demo .whl/demo --num-samples 96 --num-val-samples 8`
ESPEAK = ".whl/espeak"  # `python3 benchmarks/espeak_kit.py .whl/espeak`, for the default run
SCRATCH = ".acceptance-tmp"  # one candidate for the groups' temporary files (scratch_root)
MARGIN_S = 15  # the table printed and the files written after the last group
LOG_TAIL_LINES = 40  # of a failed group's output, kept in session.json and printed
_MARK = "AUDIOLLM_GPU_SESSION_GROUP"  # in the environment of every process a group starts


@dataclass(frozen=True)
class Group:
    name: str
    checks: str  # gpu_acceptance.py --only
    limit_s: int  # at most this long
    least_s: int  # not started with less than this left: it could not finish a row
    profile: bool = False


# Part 1 first: the GPU path's parity (were it wrong, no figure after it would mean
# anything), then the centre, the 9B recipe at full size (two launches, an 18 GB
# save, a resume: about five minutes by the CPU-side estimates), then the 2b through the
# job in the time left: the figures the issue is judged by come first, because a lease
# has held a single call before; each job row profiles one step of the job itself
# (train.profile_steps). Part 2: the step loop against HF + PEFT with its profile,
# README's first command on the GPU (its held-out WER), then the checks that passed on
# every GPU so far. Part 3, for a later lease: the default recipe's job rows.
PARTS = {
    "1": [Group("parity", "parity", 150, 60),
          Group("job9b", "job9b", 450, 240, profile=True),
          Group("job2b", "job2b", 240, 120, profile=True)],
    "2": [Group("throughput", "throughput", 300, 150, profile=True),
          Group("default", "default", 540, 240),
          Group("checks", "lora,generation,encoder,recompiles,fp8", 240, 60)],
    "3": [Group("job", "job", 420, 240)],
}
DEFAULT_SECONDS = {"1": 570, "2": 240, "3": 420}


def schedule(group: Group, seconds: float, elapsed: float) -> Optional[int]:
    """The limit `group` runs under, `elapsed` seconds into a call of `seconds`: its own
    limit or what is left, whichever is smaller; None where less than its least useful
    time is left."""
    left = seconds - elapsed - MARGIN_S
    if left < group.least_s:
        return None
    return int(min(group.limit_s, left))


def run_bounded(argv: List[str], limit: float, env: dict, log) -> int:
    """Runs `argv` (from the repository root, its output to `log`) for at most `limit`
    seconds; its exit, or 124 at the limit. At the limit every process it started goes,
    also those in sessions of their own (`audiollm train` starts its job's controller and
    ranks so): each carries this run's mark in its environment. A 9B job left behind would
    hold the GPU through the next group."""
    mark = uuid.uuid4().hex
    proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={**env, _MARK: mark})
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_marked(f"{_MARK}={mark}".encode())
        proc.wait()
        return 124


def _kill_marked(mark: bytes) -> None:
    """SIGKILL to every process whose environment holds `mark` (Linux /proc), until none is
    left, then wait until those have exited: a process being killed may still hold its
    GPU memory after its environment (read above) is gone."""
    killed = set()
    for _ in range(10):
        found = False
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                marked = mark in (entry / "environ").read_bytes().split(b"\0")
            except OSError:  # gone, or not ours to read
                continue
            if marked:
                found = True
                killed.add(int(entry.name))
                try:
                    os.kill(int(entry.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if not found:
            break
        time.sleep(0.2)
    deadline = time.time() + 30
    while any(_running(pid) for pid in killed) and time.time() < deadline:
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """Whether `pid` has yet to exit (a zombie has: it waits only for its reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _filesystem(path: Path) -> str:
    """The type of the file system holding `path` (its longest mount point in /proc/mounts)."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1]
        if (str(path) == point or str(path).startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def scratch_root(candidates: List[Path]) -> tuple:
    """Where the job rows write their runs (two 20 GB checkpoints at the 9B): of the
    candidates, the one with the most free space that is not held in memory (a tmpfs /tmp
    would put the checkpoints in the host memory the jobs need). Returns (chosen, {path:
    (free GiB, file system)}) for the record."""
    facts = {}
    for path in candidates:
        path.mkdir(parents=True, exist_ok=True)
        facts[str(path)] = (round(shutil.disk_usage(path).free / 2**30, 1), _filesystem(path.resolve()))
    chosen = max(candidates, key=lambda p: (facts[str(p)][1] not in ("tmpfs", "ramfs"), facts[str(p)][0]))
    return chosen, facts


def use_scratch(env: dict) -> dict:
    """The groups' TMPDIR (the job rows' runs, every other temporary file) at scratch_root's
    choice, emptied first: what a group killed at its limit left there (a 9B checkpoint)
    goes at the next part's start. The compiler's cache stays where the next part finds
    it. Returns the choice, for the record."""
    system_tmp = Path(tempfile.gettempdir())
    candidates = [REPO / SCRATCH, system_tmp / "audiollm-gpu-session"]
    for stale in candidates:
        shutil.rmtree(stale, ignore_errors=True)
    chosen, disks = scratch_root(candidates)
    env["TMPDIR"] = str(chosen)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(system_tmp / "torchinductor_audiollm"))
    return {"chosen": str(chosen), "free_gib_and_filesystem": disks}


def _output(argv: List[str], env: dict) -> str:
    try:
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=env, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"


class Session:
    """$OUT holds two files whatever the part (a lent machine returns at most eight):
    session.log, every group's output one after another, and session.json, the machine,
    the commit and each group's exit, time and rows. A profiled group adds two in
    profile_<group>/ (part 1: six files in all)."""

    def __init__(self, out: Path, part: str, seconds: float, env: dict, scratch: Optional[dict] = None):
        self.out, self.env = out, env
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu-session-"))
        self.record = {"part": part, "seconds": seconds,
                       "gpu": _output(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                       "--format=csv,noheader"], env),
                       "commit": _output(["git", "rev-parse", "--short", "HEAD"], env), "groups": []}
        if scratch:
            self.record["scratch"] = scratch
        self.log = open(out / "session.log", "a")
        self.write()

    def write(self) -> None:
        (self.out / "session.json").write_text(json.dumps(self.record, indent=1) + "\n")

    def setup(self) -> Optional[str]:
        """Installs the kit into .kit-site once; the problem, or None."""
        if (REPO / ".kit-site").is_dir():
            return None
        self.log.write("== setup: bash setup.sh --from-wheels .whl/kit .kit-site\n")
        self.log.flush()
        done = subprocess.run(["bash", "setup.sh", "--from-wheels", ".whl/kit", ".kit-site"], cwd=REPO,
                              stdout=self.log, stderr=subprocess.STDOUT)
        return None if done.returncode == 0 else f"the kit did not install (exit {done.returncode}): see session.log"

    def run(self, group: Group, limit: int, dry_run: bool, corpus: Path) -> dict:
        rows = self.scratch / f"{group.name}.json"
        argv = [sys.executable, "benchmarks/gpu_acceptance.py", "--only", group.checks, "--json", str(rows)]
        if dry_run:  # the job rows train the tiny model on the CPU through the same path
            argv += ["--dry-run"]
        if corpus.is_dir():  # the job rows' corpus (n/a without it)
            argv += ["--demo-corpus", str(corpus)]
        if group.profile:  # two files each (orchestrator/train/profiling.py): ops.txt, trace.json.gz
            argv += ["--profile", str(self.out / f"profile_{group.name}")]
        self.log.write(f"== {group.name}: {' '.join(argv[1:])} (limit {limit} s)\n")
        self.log.flush()
        offset = self.log.tell()
        started = time.monotonic()
        code = run_bounded(argv, limit, self.env, self.log)
        entry = {"group": group.name, "checks": group.checks, "limit_s": limit,
                 "seconds": round(time.monotonic() - started, 1), "exit": code,
                 "rows": json.loads(rows.read_text()) if rows.exists() else []}
        if code != 0:  # what it said last, in the JSON and the call's output (the log may not come back)
            self.log.flush()
            with open(self.out / "session.log", errors="replace") as log:
                log.seek(offset)
                entry["log_tail"] = log.read().splitlines()[-LOG_TAIL_LINES:]
        self.record["groups"].append(entry)
        self.write()
        return entry

    def skip(self, group: Group, left: float) -> None:
        line = f"{group.name}: skipped, {left:.0f} s left, it needs {group.least_s} s"
        print(line, flush=True)
        self.log.write(f"== {line}\n")
        self.record["groups"].append({"group": group.name, "checks": group.checks, "skipped": line})
        self.write()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--seconds", type=float, help="this call's time, from its start (defaults: "
                        + ", ".join(f"part {p} {s} s" for p, s in DEFAULT_SECONDS.items()) + ")")
    parser.add_argument("--dry-run", action="store_true", help="the acceptance's CPU dry run, no kit (a rehearsal)")
    parser.add_argument("--demo-corpus", type=Path, default=REPO / DEMO, metavar="DIR",
                        help=f"the job rows' corpus (default {DEMO}); without one they say n/a")
    args = parser.parse_args(argv)
    started = time.monotonic()
    seconds = args.seconds or DEFAULT_SECONDS[args.part]
    out = Path(os.environ.get("OUT") or "gpu-out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    scratch = None  # a dry run, beside other tests, keeps the temporary directory it was given
    if not args.dry_run:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / ".kit-site"), env.get("PYTHONPATH")]))
        scratch = use_scratch(env)
    session = Session(out, args.part, seconds, env, scratch)
    problem = None if args.dry_run else session.setup()
    if problem:
        print(problem, flush=True)
        return 1
    if not args.dry_run and (REPO / ESPEAK).is_dir() and shutil.which("espeak-ng") is None:
        # the default run makes its corpus with it (the corpus itself is too large to carry);
        # without it that row says n/a, and the other groups run
        try:
            session.env.update(espeak_kit.unpack(REPO / ESPEAK, REPO / ".espeak-root"))
        except (OSError, ValueError, tarfile.TarError) as exc:
            print(f"espeak-ng from {ESPEAK} not unpacked: {exc}", flush=True)
    for group in PARTS[args.part]:
        elapsed = time.monotonic() - started
        limit = schedule(group, seconds, elapsed)
        if limit is None:
            session.skip(group, seconds - elapsed)
            continue
        entry = session.run(group, limit, args.dry_run, args.demo_corpus)
        print(f"{group.name}: exit {entry['exit']} in {entry['seconds']:.0f} s (limit {limit} s)", flush=True)
        if entry.get("log_tail"):
            print("\n".join(f"  | {line}" for line in entry["log_tail"]), flush=True)
        if entry["rows"]:
            table = Table()
            table.rows = entry["rows"]
            print(table.render(), flush=True)
    print(f"part {args.part}: {time.monotonic() - started:.0f} s of {seconds:.0f}", flush=True)
    return 0 if all(g.get("exit", 0) == 0 for g in session.record["groups"]) else 1


if __name__ == "__main__":
    sys.exit(main())
