"""A regular (non-editable) install ships conf/ and recipes/ and works from any directory."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _source_packages() -> set[str]:
    found = set()
    for top in ("orchestrator", "launchers"):
        for init in (REPO / top).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(REPO).parts))
    return found


def test_every_python_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    missing = _source_packages() - listed
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(missing)}"


def test_wheel_ships_configuration_and_plans_from_another_directory(tmp_path):
    # Build from a clean copy: setuptools reuses an in-tree build/ directory, whose stale
    # files would hide a package missing from pyproject.toml.
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "outputs", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
                   check=True, timeout=300, capture_output=True)
    wheel = next(tmp_path.glob("audiollm-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"orchestrator/_conf/{p.relative_to(REPO / 'conf')}" for p in (REPO / "conf").rglob("*.yaml")}
    shipped |= {f"orchestrator/_recipes/{p.name}" for p in (REPO / "recipes").glob("*.yaml")}
    assert "orchestrator/_conf/model/gemma2_9b_whisper_large_v3.yaml" in shipped
    missing = sorted(shipped - names)
    assert not missing, f"not in the wheel (list the folder in pyproject.toml packages): {missing}"
    target = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(target)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c",
         # Drop the editable install's finder so that only the extracted wheel can be imported.
         "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
         "sys.path.insert(0, sys.argv[1]); from orchestrator.cli import main; "
         "import orchestrator.plan.schema, orchestrator.plan.paths as p; "
         "assert orchestrator.plan.schema.__file__.startswith(sys.argv[1]), orchestrator.plan.schema.__file__; "
         "assert str(p.conf_dir()).startswith(sys.argv[1]), p.conf_dir(); "
         "sys.exit(main(['plan', '+recipe=gemma2_whisper_tp4pp2', '--json']))", str(target)],
        capture_output=True, text=True, timeout=120, cwd=elsewhere,
        env={"PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1",
             "AUDIOLLM_INIT_CHECKPOINT": os.environ["AUDIOLLM_INIT_CHECKPOINT"]},  # tests/conftest.py
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r'"dp": 4', proc.stdout)


def _requirements() -> dict:
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {Requirement(r).name: Requirement(r) for r in listed}


def test_torch_is_a_range_that_admits_a_clusters_own_torch_and_the_installed_one():
    import torch

    spec = _requirements()["torch"].specifier
    installed = torch.__version__.split("+")[0]
    # 2.11: the torch a GPU machine without internet brings (docs/gpu-machines.md).
    assert spec.contains("2.11.0") and spec.contains(installed), (str(spec), installed)


def test_the_gpu_extra_asks_for_the_transformer_engine_megatron_core_supports():
    import importlib.metadata

    from packaging.requirements import Requirement

    ours = _requirements()["transformer-engine"].specifier
    declared = next(Requirement(r) for r in importlib.metadata.requires("megatron-core")
                    if r.startswith("transformer-engine")).specifier
    # Same bounds: on either side of each bound, one admits a version exactly when the other does.
    for version in ("2.0", "2.8.0", "2.9.0", "2.10.0", "2.11.0", "2.12.0", "2.20.2"):
        assert ours.contains(version) == declared.contains(version, prereleases=False), (version, str(ours), str(declared))


def test_the_hf_import_names_the_extra_that_installs_what_it_reads_with(monkeypatch):
    """`audiollm data import hf` needs HF datasets, which the default install leaves out:
    the project's `hf` extra installs it (and the test extra, at the same bounds), and the
    error says how."""
    import pytest

    from orchestrator.data.importing import hf
    from orchestrator.data.importing.records import SourceError

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["hf"] == [hf.DATASETS_REQUIREMENT] and hf.DATASETS_REQUIREMENT in extras["test"]
    assert 'want_hf=1' in (REPO / "setup.sh").read_text() and 'extras="[hf]"' in (REPO / "setup.sh").read_text()
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(SourceError, match=r"install the project's hf extra \(`bash setup.sh --hf`"):
        hf.open_split("/any", None)
