"""Launchers: where the job's processes start (this machine or SLURM, both via submitit).

Submit side (`commands`, `rundir`, `executors`, `sweep`, `summary`) never imports torch;
job side (`job`, `runtime`) imports it only inside functions that run on a rank.
"""
