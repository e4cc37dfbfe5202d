"""Launchers: where the job's processes start (this machine or SLURM, both via submitit).

One module per command: train (and sweep for -m), prepare, status (and cancel); what
they share: runs (a prepared run), checks (before submission), submit, follow (a
submitted job's output and end). Submit side modules never import torch; job.py,
watchdog.py and failures.py run beside the ranks and import it only inside functions
that run there. offline_wheels: `audiollm wheels`, what an offline GPU machine needs.
"""
