"""Many rank roles probed from one process:
`python -m orchestrator.probe.forks ROLES_JSON WORKERS`.

A role's own process (orchestrator/probe/role.py) spends about 6 s of CPU importing
torch, megatron, transformers' Whisper and the job before it probes; a sweep's probes or
a recipe's several stages paid that once per role. This process imports it all once
(role.preload) and forks a child per role, at most WORKERS at once. Forking is safe
here: imports run no parallel tensor operation (OpenMP's threads start at the first),
the one thread torch starts as it loads waits idle, and each child builds its own fake
process group and stand-ins, as a fresh process would.

ROLES_JSON: a list of {"plan": PLAN_JSON, "stage", "cp_rank", "out": OUT_JSON, "log": LOG};
each child probes its role (role.probe_role), writes the result to "out" and its output to
"log". This process prints `INDEX EXIT_STATUS` for each role as it ends and exits 0 once
all have; the submit side (orchestrator/plan/probe_report.py) stops it at the first failure.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings
from pathlib import Path


def _probe_in_child(role, job: dict) -> None:
    """The forked child: its output to its log, its result to its file; never returns."""
    code = 1
    try:
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        result = role.probe_role(Path(job["plan"]), int(job["stage"]), int(job["cp_rank"]))
        Path(job["out"]).write_text(json.dumps(result, indent=1))
        code = 0
    except BaseException:  # noqa: B036 -- whatever ends the child, its log says it and its status is 1
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # os._exit: the parent's atexit handlers and buffers are not the child's to run
        # (and torch's final collection at exit has crashed a process now and then)
        os._exit(code)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 2:
        print("usage: python -m orchestrator.probe.forks ROLES_JSON WORKERS", file=sys.stderr)
        return 2
    # Before torch is imported: the probe is a CPU process whatever machine runs it (role.main says why).
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from orchestrator.probe import role

    role.preload()
    # Python 3.12 warns at a fork in a process with more than one thread: torch's idle one
    # (above) is no lock a child needs.
    warnings.filterwarnings("ignore", message=r"This process .* is multi-threaded", category=DeprecationWarning)
    jobs = json.loads(Path(argv[0]).read_text())
    workers = max(1, int(argv[1]))
    pending, running = list(enumerate(jobs)), {}
    while pending or running:
        while pending and len(running) < workers:
            index, job = pending.pop(0)
            sys.stdout.flush()  # nothing of this process's output left for the child to print again
            pid = os.fork()
            if pid == 0:
                _probe_in_child(role, job)
            running[pid] = index
        pid, status = os.wait()
        print(running.pop(pid), os.waitstatus_to_exitcode(status), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
