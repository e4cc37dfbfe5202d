"""The sbatch script the SLURM launcher submits, rendered without a cluster.

Golden files: see tests/golden.py (AUDIOLLM_REGENERATE_GOLDEN=1 regenerates).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launchers.kinds.slurm import render_sbatch, slurm_parameters
from orchestrator.plan.compose import compose
from tests.golden import check_golden

GOLDEN = Path(__file__).parent / "golden"
FOLDER = Path("/RUN_DIR/submitit")  # a stand-in: the real one is <run dir>/submitit
SITE = [
    "launcher.partition=gpu", "launcher.account=proj42", "launcher.qos=high", "launcher.constraint=h100",
    "launcher.exclusive=true", "launcher.mem_gb=480", "launcher.timeout_min=1440",
    "launcher.setup=['module load cuda/12.4','export NCCL_DEBUG=WARN']", "launcher.srun_args=['--cpu-bind=none']",
    "+launcher.additional_sbatch.mail-type=END",
]
CASES = {
    "gemma2_whisper_tp4pp2.sbatch": ["+recipe=gemma2_whisper_tp4pp2"],
    "gemma2_whisper_tp4pp2_site.sbatch": ["+recipe=gemma2_whisper_tp4pp2", *SITE],
}


def _render(overrides: list[str], array_size: int | None = None) -> str:
    launcher = OmegaConf.to_container(compose(overrides).launcher, resolve=True)
    return render_sbatch(launcher, FOLDER, "audiollm-gemma2_whisper_tp4pp2", array_size=array_size, interpreter="python")


@pytest.mark.parametrize("name", sorted(CASES))
def test_sbatch_matches_golden(name):
    text = _render(CASES[name])
    check_golden(GOLDEN / name, text)


def test_recipe_topology_reaches_sbatch():
    # 4 nodes x 8 GPUs: one task per GPU, time limit and warning signal from the launcher section.
    text = _render(CASES["gemma2_whisper_tp4pp2.sbatch"])
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --time=240", "#SBATCH --signal=USR2@120"):
        assert line in text.splitlines()


def test_site_options_reach_sbatch():
    lines = _render(CASES["gemma2_whisper_tp4pp2_site.sbatch"]).splitlines()
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=proj42", "#SBATCH --qos=high",
                 "#SBATCH --constraint=h100", "#SBATCH --exclusive", "#SBATCH --mem=480GB",
                 "#SBATCH --mail-type=END", "module load cuda/12.4", "export NCCL_DEBUG=WARN"):
        assert line in lines, line
    srun = next(line for line in lines if line.startswith("srun "))
    assert "--cpu-bind=none" in srun and srun.endswith("python -u -m launchers.rank_start -u -m submitit.core._submit /RUN_DIR/submitit")


def test_cpu_jobs_ask_for_no_gpus_and_arrays_are_bounded():
    launcher = OmegaConf.to_container(compose(["launcher=slurm", "launcher.accelerator=cpu"]).launcher)
    assert "gpus_per_node" not in slurm_parameters(launcher, "x")
    launcher["array_parallelism"] = 2
    text = render_sbatch(launcher, FOLDER, "x", array_size=5, interpreter="python")
    assert "#SBATCH --array=0-4%2" in text.splitlines()
    assert "#SBATCH --output=/RUN_DIR/submitit/%A_%a_0_log.out" in text.splitlines()
