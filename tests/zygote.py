"""Rank processes forked from one interpreter that has imported torch, megatron-core and
the job's packages already: the tests' stand-in for `python -m torch.distributed.run`.

Every torchrun of a test paid about 9 s on 2 cores before its first line ran (torchrun
itself imports torch; each rank imports torch, megatron-core, transformers and the
project), and the suite starts well over a hundred of them. Here one process (the
zygote, started on first use and ended with the test session) imports all that once;
each launch is a fork of it that forks one child per rank. A rank runs the same script
or module as torchrun would start (`__main__`, its argv, torchrun's rank variables, the
environment the test gave), with output to the test's log, and ends like a process
does (SystemExit, atexit handlers); the launch reports each failed rank's exit code the
way torchrun's summary does ("exitcode: 17") and stops the other ranks.

What the product starts (the local and SLURM launchers' ranks, `audiollm` commands) is
not started here: those tests start real interpreters.

Safe to fork because the zygote stays single-threaded: imports start no threads, and it
runs no tensor operation (OpenMP's pool would be a thread).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from orchestrator.runtime.ports import free_port

REPO = Path(__file__).resolve().parents[1]
# What every rank would import first; what a script imports beyond this it imports itself.
PRELOAD = ("torch", "torch.distributed", "transformers", "orchestrator.models", "orchestrator.train.entry",
           "orchestrator.data.loader")
STOP_GRACE_S = 5.0  # SIGTERM to the other ranks when one fails, then SIGKILL


# ---- the test side ----------------------------------------------------------------------

_server: dict = {}
_lock = threading.Lock()


def _socket_path() -> str:
    with _lock:
        if _server and _server["proc"].poll() is None:
            return _server["path"]
        path = os.path.join(tempfile.mkdtemp(prefix="audiollm-zygote-"), "sock")
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        errors = Path(path).with_name("zygote.log")
        with open(errors, "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "tests.zygote", path], cwd=REPO, env=env,
                                    stdout=subprocess.PIPE, stderr=err, text=True)
        if proc.stdout.readline().strip() != "ready":  # said once the imports are done
            proc.wait()
            raise RuntimeError(f"the zygote did not start:\n{errors.read_text()[-4000:]}")
        _server.update(proc=proc, path=path)
        atexit.register(proc.kill)
        return path


def run(target: list[str], nproc: int, args: list[str], *, env: dict, cwd: Path, log_path: Path,
        timeout: float) -> int:
    """Run `target` (["-m", module] or [script]) with `args` on `nproc` forked ranks, their
    output to `log_path`. Returns what torchrun would exit with: 0, or 1 if a rank failed.
    Past `timeout` every rank is killed and subprocess.TimeoutExpired raised."""
    request = {"target": target, "args": list(args), "nproc": nproc, "env": env, "cwd": str(cwd),
               "log": str(log_path)}
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(_socket_path())
        conn.sendall((json.dumps(request) + "\n").encode())
        conn.settimeout(timeout)
        reader = conn.makefile("r")
        launcher = json.loads(reader.readline())["pid"]
        try:
            reply = reader.readline()
        except socket.timeout:
            _kill_group(launcher)
            raise subprocess.TimeoutExpired(target, timeout) from None
        if not reply:
            raise RuntimeError(f"the zygote's launch of {target} ended without a result; see {log_path}")
        return json.loads(reply)["rc"]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ---- the zygote --------------------------------------------------------------------------

def serve(path: str) -> None:
    import importlib

    for module in PRELOAD:
        importlib.import_module(module)
    assert threading.active_count() == 1, "the zygote must stay single-threaded to fork safely"
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(64)
    server.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # launches are reaped by the kernel
    print("ready", flush=True)
    while os.getppid() == parent:  # the test session is gone: so is the zygote
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        if os.fork() == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            server.close()
            try:
                _launch(conn)
            except SystemExit:
                if _as_rank:
                    raise  # a rank ends as a process does: its atexit handlers, then its exit code
            except BaseException:
                import traceback

                traceback.print_exc()
            os._exit(0)
        conn.close()


def _launch(conn: socket.socket) -> None:
    """One torchrun: this process leads a process group of its ranks (the test kills the
    group on a timeout)."""
    os.setsid()
    request = json.loads(conn.makefile("r").readline())
    conn.sendall((json.dumps({"pid": os.getpid()}) + "\n").encode())
    nproc = request["nproc"]
    port = free_port()
    log = open(request["log"], "a", buffering=1)
    sys.stdout.flush(), sys.stderr.flush()
    ranks = {}
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            conn.close()
            _rank(request, rank, port, log.fileno())  # never returns
        ranks[pid] = rank
    failed = {}
    while ranks:
        pid, status = os.wait()
        rank = ranks.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and not failed:
            failed[rank] = code
            _stop(ranks)
        elif code != 0 and rank not in failed:
            failed.setdefault(rank, code)
    if failed:  # torchrun's summary names each failed rank with its exit code
        log.write("ChildFailedError:\n" + "".join(
            f"  rank: {rank} (local_rank: {rank})\n  exitcode: {code}\n" for rank, code in sorted(failed.items())))
    log.close()
    conn.sendall((json.dumps({"rc": 1 if failed else 0}) + "\n").encode())


def _stop(ranks: dict) -> None:
    for pid in ranks:
        _signal(pid, signal.SIGTERM)

    def kill_later():
        import time

        time.sleep(STOP_GRACE_S)
        for pid in ranks:
            _signal(pid, signal.SIGKILL)

    threading.Thread(target=kill_later, daemon=True).start()


def _signal(pid: int, sig) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


_as_rank = False


def _rank(request: dict, rank: int, port: int, log_fd: int) -> None:
    """Become rank `rank` of the launch and run its target as `__main__`; exit as a process does."""
    import runpy

    global _as_rank
    _as_rank = True

    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    nproc = request["nproc"]
    env = dict(request["env"])
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank), WORLD_SIZE=str(nproc),
               LOCAL_WORLD_SIZE=str(nproc), ROLE_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0",
               TORCHELASTIC_RUN_ID="zygote")
    env.setdefault("OMP_NUM_THREADS", "1")
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    import torch

    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    target = request["target"]
    if target[0] == "-m":
        sys.argv = [target[1], *request["args"]]
        sys.path[:0] = [request["cwd"], *extra]
        run = lambda: runpy.run_module(target[1], run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        sys.argv = [target[0], *request["args"]]
        sys.path[:0] = [str(Path(target[0]).resolve().parent), *extra]
        run = lambda: runpy.run_path(target[0], run_name="__main__")  # noqa: E731
    if env.get("PYTHONWARNINGS"):
        import warnings

        warnings.simplefilter(env["PYTHONWARNINGS"])
    try:
        run()
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    serve(sys.argv[1])
