"""Rendezvous ports below the ephemeral range (orchestrator/runtime/ports.py); a local
job's and a SLURM job's use of them: tests/launchers/test_local.py and
tests/slurm/test_slurm_jobs.py."""

import socket

from orchestrator.runtime.ports import END_PORT, FIRST_PORT, free_port, port_for_job


def test_a_free_port_lies_below_the_ports_lent_to_connections_and_can_be_bound():
    assert END_PORT == 32768  # Linux's first ephemeral port unless a sysctl moves it
    for _ in range(20):
        port = free_port()
        assert FIRST_PORT <= port < END_PORT, port
        with socket.socket() as sock:
            sock.bind(("", port))


def test_a_held_port_is_not_given(monkeypatch):
    held = socket.socket()
    held.bind(("", 0))
    held.listen()
    port = held.getsockname()[1]
    draws = iter([port, port, FIRST_PORT + 1])
    from orchestrator.runtime import ports

    monkeypatch.setattr(ports._draw, "randrange", lambda a, b: next(draws))
    try:
        assert free_port() == FIRST_PORT + 1
    finally:
        held.close()


def test_every_task_of_a_job_derives_the_same_port_and_neighbouring_jobs_differ():
    assert port_for_job("123456") == port_for_job("123456")
    ports = {port_for_job(str(job)) for job in range(1000, 1100)}
    assert len(ports) == 100 and all(FIRST_PORT <= p < END_PORT for p in ports)
    array_task = port_for_job("4242_3")  # submitit's id of an array task
    assert FIRST_PORT <= array_task < END_PORT and array_task != port_for_job("4242_4")
