"""Does a SLURM request fit the cluster at all? Checked before submission.

SLURM queues a job that no node of its partition can ever run and leaves it pending
forever (reason `PartitionConfig`, `ReqNodeNotAvail`, `QOSMaxWallDurationPerJobLimit`,
...): a user who asks for the launcher's default 8 CPUs per task on nodes of 2 CPUs
waits for nothing. Where the cluster answers (`scontrol`), the launcher section is
checked against the partition's configuration: partition, nodes, CPUs and GPUs and
memory per node, time limit, account and QOS. Node states are not held against a
request (a drained node comes back); configured sizes are.

Only the submit side uses this; it runs SLURM's own commands and never imports torch.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

_FIELD = re.compile(r"(\w+)=(\S*)")
UNLIMITED = None  # a limit SLURM reports as UNLIMITED / NONE / INFINITE


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int  # RealMemory
    gpus: int  # gres/gpu count
    state: str
    partitions: tuple


@dataclass
class Partition:
    name: str
    default: bool
    max_nodes: Optional[int]
    max_time_min: Optional[int]
    max_cpus_per_node: Optional[int]
    max_mem_per_node_mb: Optional[int]
    allow_accounts: Optional[List[str]]  # None: all
    allow_qos: Optional[List[str]]
    state: str
    nodes: List[Node] = field(default_factory=list)


@dataclass
class ClusterView:
    partitions: Dict[str, Partition]
    accounts: Optional[List[str]] = None  # None: accounting does not answer (not checked)
    qos: Optional[List[str]] = None

    def default_partition(self) -> Optional[Partition]:
        return next((p for p in self.partitions.values() if p.default), None)


def _records(text: str) -> List[Dict[str, str]]:
    return [dict(_FIELD.findall(line)) for line in text.splitlines() if "=" in line]


def _limit(value: Optional[str]) -> Optional[int]:
    if value is None or value.upper() in ("UNLIMITED", "NONE", "INFINITE", "N/A", ""):
        return UNLIMITED
    return int(value)


def time_minutes(value: Optional[str]) -> Optional[int]:
    """SLURM's time format -> minutes (seconds round up): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    if value is None or value.upper() in ("UNLIMITED", "NONE", "INFINITE", "N/A", ""):
        return UNLIMITED
    days = 0
    if "-" in value:
        head, value = value.split("-", 1)
        days = int(head)
        hours, minutes, seconds = ([int(p) for p in value.split(":")] + [0, 0])[:3]
    else:
        parts = [int(p) for p in value.split(":")]
        hours, minutes, seconds = {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]
    return days * 1440 + hours * 60 + minutes + (1 if seconds else 0)


def _gpus(gres: str) -> int:
    """'gpu:2', 'gpu:h100:8(S:0-1)', 'gpu:a100:4,shard:8' -> GPU count."""
    total = 0
    for item in (gres or "").split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def _names(value: Optional[str]) -> Optional[List[str]]:
    return None if value in (None, "ALL", "") else value.split(",")


def parse_cluster(partitions_text: str, nodes_text: str) -> Dict[str, Partition]:
    """`scontrol show partition -o` and `scontrol show node -o` -> partitions with their nodes."""
    partitions: Dict[str, Partition] = {}
    for rec in _records(partitions_text):
        if "PartitionName" not in rec:
            continue
        mem = rec.get("MaxMemPerNode")
        partitions[rec["PartitionName"]] = Partition(
            name=rec["PartitionName"], default=rec.get("Default") == "YES", max_nodes=_limit(rec.get("MaxNodes")),
            max_time_min=time_minutes(rec.get("MaxTime")), max_cpus_per_node=_limit(rec.get("MaxCPUsPerNode")),
            max_mem_per_node_mb=_limit(mem), allow_accounts=_names(rec.get("AllowAccounts")),
            allow_qos=_names(rec.get("AllowQos")), state=rec.get("State", "UP"))
    for rec in _records(nodes_text):
        if "NodeName" not in rec:
            continue
        node = Node(name=rec["NodeName"], cpus=int(rec.get("CPUTot", 0)), memory_mb=int(rec.get("RealMemory", 0)),
                    gpus=_gpus(rec.get("Gres", "")), state=rec.get("State", ""),
                    partitions=tuple(p for p in rec.get("Partitions", "").split(",") if p))
        for name in node.partitions:
            if name in partitions:
                partitions[name].nodes.append(node)
    return partitions


def slurm_output(argv: List[str], timeout: float = 20.0) -> Optional[str]:
    """stdout of a SLURM command, or None where it is missing, fails or does not answer
    in `timeout` seconds. The command runs in a process group of its own, killed whole at
    the timeout, so that nothing it started outlives the check."""
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                start_new_session=True)
    except OSError:
        return None
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=1.0)
        return None
    return out if proc.returncode == 0 else None


# How long the cluster check waits for SLURM's answers. A controller answers these
# queries in milliseconds; one that is down (or a laptop with SLURM's client installed
# and no controller) makes each query retry for about 9 s before it fails. The queries
# run side by side and the check is skipped, saying so, when they do not answer in time.
QUERY_TIMEOUT_ENV = "AUDIOLLM_SLURM_QUERY_TIMEOUT_S"
DEFAULT_QUERY_TIMEOUT_S = 0.5


def query_timeout() -> float:
    return float(os.environ.get(QUERY_TIMEOUT_ENV) or DEFAULT_QUERY_TIMEOUT_S)


def controller_name() -> str:
    """SlurmctldHost (or ControlMachine) of this machine's slurm.conf, as SLURM's client
    finds it ($SLURM_CONF, else /etc/slurm/slurm.conf); "the controller" if unreadable."""
    conf = Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    try:
        text = conf.read_text()
    except OSError:
        return "the controller"
    found = re.search(r"^\s*(?:SlurmctldHost|ControlMachine)\s*=\s*(\S+)", text, re.M | re.I)
    return f"the controller at {found.group(1)} ({conf})" if found else "the controller"


def read_cluster(timeout: Optional[float] = None) -> Optional[ClusterView] | str:
    """The cluster's partitions, nodes, accounts and QOS; None where SLURM's client is not
    installed; a sentence saying why not where the controller does not answer in
    `timeout` seconds (default: query_timeout())."""
    if shutil.which("scontrol") is None:
        return None
    timeout = query_timeout() if timeout is None else timeout
    queries = {"partitions": ["scontrol", "show", "partition", "-o"], "nodes": ["scontrol", "show", "node", "-o"]}
    if shutil.which("sacctmgr"):
        queries.update(accounts=["sacctmgr", "-n", "-P", "show", "account", "format=account"],
                       qos=["sacctmgr", "-n", "-P", "show", "qos", "format=name"])
    with ThreadPoolExecutor(max_workers=len(queries)) as pool:
        running = {name: pool.submit(slurm_output, argv, timeout) for name, argv in queries.items()}
        answers = {name: future.result() for name, future in running.items()}
    if answers["partitions"] is None or answers["nodes"] is None:
        return f"{controller_name()} did not answer in {timeout:g} s ({QUERY_TIMEOUT_ENV} sets the wait)"
    view = ClusterView(parse_cluster(answers["partitions"], answers["nodes"]))
    if answers.get("accounts") is not None:
        view.accounts = [a for a in answers["accounts"].split() if a]
    if answers.get("qos") is not None:
        view.qos = [q for q in answers["qos"].split() if q]
    return view


def _gb(mb: int) -> str:
    return f"{mb / 1024:.0f} GB"


def request_problems(launcher: Mapping[str, Any], view: ClusterView) -> List[str]:
    """Why no node of the requested partition can ever run this launcher section ([] if it can)."""
    name = launcher.get("partition")
    if name:
        part = view.partitions.get(str(name))
        if part is None:
            return [f"launcher.partition={name}: the cluster has no such partition (it has "
                    f"{', '.join(sorted(view.partitions)) or 'none'}); set launcher.partition to one of them"]
    else:
        part = view.default_partition()
        if part is None:
            return [f"launcher.partition is not set and the cluster has no default partition; set "
                    f"launcher.partition to one of {', '.join(sorted(view.partitions))}"]
    where = f"partition {part.name}"
    problems: List[str] = []
    nodes_wanted = int(launcher["nodes"])
    tasks = int(launcher["gpus_per_node"])
    cpus = tasks * int(launcher["cpus_per_task"])
    gpus = tasks if launcher.get("accelerator") == "gpu" else 0
    mem_mb = int(launcher["mem_gb"]) * 1024 if launcher.get("mem_gb") is not None else 0
    if part.max_nodes is not None and nodes_wanted > part.max_nodes:
        problems.append(f"launcher.nodes={nodes_wanted} but {where} allows at most {part.max_nodes} nodes per "
                        f"job (MaxNodes); ask for fewer nodes or another partition")
    if part.max_time_min is not None and int(launcher["timeout_min"]) > part.max_time_min:
        problems.append(f"launcher.timeout_min={launcher['timeout_min']} exceeds the time limit of {where} "
                        f"({part.max_time_min} min, MaxTime); set launcher.timeout_min={part.max_time_min} or less "
                        f"(a run continues across attempts)")
    if part.max_cpus_per_node is not None and cpus > part.max_cpus_per_node:
        problems.append(f"{tasks} tasks x launcher.cpus_per_task={launcher['cpus_per_task']} = {cpus} CPUs per "
                        f"node but {where} lets a job use {part.max_cpus_per_node} CPUs of a node "
                        f"(MaxCPUsPerNode); set launcher.cpus_per_task={max(1, part.max_cpus_per_node // tasks)}")
    if part.max_mem_per_node_mb is not None and mem_mb > part.max_mem_per_node_mb:
        problems.append(f"launcher.mem_gb={launcher['mem_gb']} exceeds {where}'s MaxMemPerNode "
                        f"({_gb(part.max_mem_per_node_mb)}); set launcher.mem_gb="
                        f"{part.max_mem_per_node_mb // 1024} or less")
    for account_key, allowed, known in (("account", part.allow_accounts, view.accounts),
                                        ("qos", part.allow_qos, view.qos)):
        value = launcher.get(account_key)
        if value is None:
            continue
        if known is not None and str(value) not in known:
            problems.append(f"launcher.{account_key}={value}: the cluster has no such {account_key} "
                            f"(it has {', '.join(known)})")
        elif allowed is not None and str(value) not in allowed:
            problems.append(f"launcher.{account_key}={value} may not use {where} (it allows "
                            f"{', '.join(allowed)})")
    if not part.nodes:
        return problems + [f"{where} has no nodes"]
    if nodes_wanted > len(part.nodes):
        problems.append(f"launcher.nodes={nodes_wanted} but {where} has {len(part.nodes)} node(s) "
                        f"({', '.join(n.name for n in part.nodes)}); set launcher.nodes={len(part.nodes)} or less")
    fitting = [n for n in part.nodes if n.cpus >= cpus and n.gpus >= gpus and n.memory_mb >= mem_mb]
    if len(fitting) < nodes_wanted:
        most_cpus = max(n.cpus for n in part.nodes)
        most_gpus = max(n.gpus for n in part.nodes)
        most_mem = max(n.memory_mb for n in part.nodes)
        if cpus > most_cpus:
            problems.append(f"launcher.gpus_per_node={tasks} tasks x launcher.cpus_per_task="
                            f"{launcher['cpus_per_task']} = {cpus} CPUs per node, but the nodes of {where} have at "
                            f"most {most_cpus} CPUs; set launcher.cpus_per_task={max(1, most_cpus // tasks)}"
                            + ("" if most_cpus >= tasks else " and fewer launcher.gpus_per_node"))
        if gpus > most_gpus:
            problems.append(f"launcher.gpus_per_node={gpus} but the nodes of {where} have at most {most_gpus} GPUs"
                            + (f"; set launcher.gpus_per_node={most_gpus} (and more launcher.nodes)" if most_gpus
                               else "; set launcher.accelerator=cpu or choose a partition with GPUs"))
        if mem_mb > most_mem:
            problems.append(f"launcher.mem_gb={launcher['mem_gb']} per node, but the nodes of {where} have at most "
                            f"{_gb(most_mem)}; set launcher.mem_gb={most_mem // 1024} or less")
        if not problems:  # each resource fits some node, but not enough nodes have them all
            problems.append(f"only {len(fitting)} node(s) of {where} have {cpus} CPUs, {gpus} GPUs and "
                            f"{_gb(mem_mb)} together; launcher.nodes={nodes_wanted} needs {nodes_wanted}")
    return problems
