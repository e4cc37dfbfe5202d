"""Rendezvous ports for torch.distributed (no torch import).

Linux hands out ephemeral ports, the local end of every outgoing connection and of
every bind to port 0, from net.ipv4.ip_local_port_range: 32768-60999 by default. A
rendezvous port taken from that range (a bind to port 0, or submitit's random
20000-60000) can be held by someone else's connection between choosing it and rank 0
binding it; a job reading from S3 opens connections all along, and the job then fails
with EADDRINUSE. The ports here lie below that range, where only a server that asks
for the number itself can hold one.
"""

from __future__ import annotations

import random
import socket
import zlib

FIRST_PORT = 20000
END_PORT = 32768  # Linux's first ephemeral port by default
_draw = random.SystemRandom()  # forked processes must not draw the same sequence


def free_port() -> int:
    """A port below the ephemeral range that no one on this host holds now."""
    for _ in range(200):
        port = _draw.randrange(FIRST_PORT, END_PORT)
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {FIRST_PORT}-{END_PORT - 1} after 200 draws: set MASTER_PORT yourself")


def port_for_job(job_id: str) -> int:
    """The same port on every node of a job without talking to the others: derived from
    the scheduler's job id (consecutive ids get consecutive ports), below the ephemeral
    range."""
    number = int(job_id) if job_id.isdigit() else zlib.crc32(job_id.encode())
    return FIRST_PORT + number % (END_PORT - FIRST_PORT)
