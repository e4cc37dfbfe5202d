"""A real single-node SLURM cluster for the tests marked `slurm`.

The session fixture `slurm_cluster` uses a cluster that already answers
(`scontrol ping`), or starts one with tests/slurm/start_slurm.sh (as root; it
installs the Debian packages if missing, as `bash setup.sh --test` does) and stops
it with tests/slurm/stop_slurm.sh when the session ends. So `python -m pytest`
alone works on a fresh machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BASE = Path(os.environ.get("SLURM_TEST_BASE", "/tmp/audiollm-slurm"))


def _patient_cluster_checks() -> None:
    """The cluster check's wait for scontrol (launchers/slurm_fit.py): its default is for a
    controller on a machine of its own; the test clusters share two cores with the whole
    suite, where a query can take longer. Raised once a test cluster is up, not for the
    whole session: before, with a slurm.conf but no controller, each `audiollm plan` of a
    SLURM recipe anywhere in the suite waited ~9 s for SLURM's client to give up.
    tests/launchers/test_slurm_fit.py checks the default's skip."""
    os.environ.setdefault("AUDIOLLM_SLURM_QUERY_TIMEOUT_S", "20")


def cluster_ready() -> bool:
    if shutil.which("scontrol") is None or shutil.which("sinfo") is None:
        return False
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20).stdout
        if "UP" not in ping:
            return False
        node = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=20).stdout
    except (subprocess.SubprocessError, OSError):
        return False
    return any(state.strip().rstrip("*") in ("idle", "mix", "alloc") for state in node.split())


@pytest.fixture(scope="session")
def slurm_cluster():
    conf = BASE / "etc" / "slurm.conf"
    if conf.exists() and not os.environ.get("SLURM_CONF") and not Path("/etc/slurm/slurm.conf").exists():
        os.environ["SLURM_CONF"] = str(conf)
    _patient_cluster_checks()
    if cluster_ready():
        yield "existing"
        return
    if os.geteuid() != 0:
        pytest.skip("no SLURM cluster answers and starting one needs root: sudo bash tests/slurm/start_slurm.sh")
    start = subprocess.run(["bash", str(HERE / "start_slurm.sh")], capture_output=True, text=True, timeout=600)
    if start.returncode != 0:
        pytest.fail(f"tests/slurm/start_slurm.sh failed ({start.returncode}):\n{start.stdout}\n{start.stderr}")
    os.environ.setdefault("SLURM_CONF", str(conf))
    deadline = time.time() + 60
    while not cluster_ready():
        if time.time() > deadline:
            pytest.fail("SLURM started but the node is not usable after 60 s:\n" + start.stdout)
        time.sleep(0.5)
    yield "started"
    subprocess.run(["bash", str(HERE / "stop_slurm.sh")], capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------- several nodes

MULTI_BASE = Path(os.environ.get("SLURM_MULTI_TEST_BASE", "/tmp/audiollm-slurm-multi"))
# Three nodes, so that a 2-node job whose node dies can be requeued onto the two others.
MULTI_NODES = 3


def namespaces_unavailable() -> str | None:
    """Why this machine cannot make the nodes (network + UTS namespaces), or None."""
    if os.geteuid() != 0:
        return "the multi-node cluster needs root (network namespaces, a bridge): sudo python -m pytest"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"the multi-node cluster needs `{tool}` (apt-get install -y iproute2 util-linux)"
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"this machine cannot create network namespaces: {probe.stderr.strip()}"
    return None


_MULTI_ENV = {"SLURM_MULTI_BASE": str(MULTI_BASE)}
# "considered": the first test here has set up; "proc": the start it began, until taken up
_multi_start: dict = {}


def _start_multi_node_cluster() -> subprocess.Popen:
    return subprocess.Popen(["bash", str(HERE / "start_cluster.sh"), str(MULTI_NODES)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **_MULTI_ENV})


def pytest_runtest_setup(item):
    """Start the multi-node cluster (~45 s, mostly waiting for its daemons) in the
    background with the first test of this directory, when the session has tests that
    need it: tests/conftest.py runs this directory's files on that cluster last, so its
    start overlaps the single-node tests. It has its own slurm.conf (tests select it
    with SLURM_CONF), so nothing else sees it before. Under pytest-xdist only the worker
    that runs this directory (one unit of work) starts it."""
    if _multi_start.get("considered"):
        return
    _multi_start["considered"] = True
    if any("slurm_nodes" in i.fixturenames for i in item.session.items) and not namespaces_unavailable():
        _multi_start["proc"] = _start_multi_node_cluster()


def pytest_sessionfinish(session):
    """A start that no test took up (the session stopped before them): stop that cluster."""
    start = _multi_start.pop("proc", None)
    if start is not None:
        start.communicate(timeout=600)
        subprocess.run(["bash", str(HERE / "stop_cluster.sh")], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **_MULTI_ENV})


@pytest.fixture(scope="session")
def slurm_nodes():
    """A real SLURM cluster of MULTI_NODES nodes on this machine, each a network namespace
    with its own hostname and address (tests/slurm/start_cluster.sh); yields its
    slurm.conf. Tests select it with SLURM_CONF (monkeypatch.setenv): it coexists with
    the single-node cluster of `slurm_cluster`. Stopped when the session ends."""
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    _patient_cluster_checks()
    start = _multi_start.pop("proc", None) or _start_multi_node_cluster()
    try:
        out, err = start.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        start.kill()
        out, err = start.communicate()
    if start.returncode != 0:
        pytest.fail(f"tests/slurm/start_cluster.sh failed ({start.returncode}):\n{out}\n{err}")
    yield MULTI_BASE / "etc" / "slurm.conf"
    subprocess.run(["bash", str(HERE / "stop_cluster.sh")], capture_output=True, text=True, timeout=300,
                   env={**os.environ, **_MULTI_ENV})
