"""`audiollm wheels DIR`: the wheels a GPU machine without internet needs to run jobs.

Many GPU clusters reach no package index, and bring their own CUDA build of torch.
On a connected machine where the project is installed, this writes into DIR the
project's own wheel and a wheel of every package the job side needs, at the versions
installed here, built for the target Python (default 3.12) on x86-64 Linux. On the GPU
machine, `bash setup.sh --from-wheels DIR` installs them beside its own torch (with
`pip install --no-index --no-deps --target`, so it works where `python3` is itself a
virtual environment).

`--kit` writes only what a machine that brings its own torch, transformers and numpy
lacks (the typical GPU image): those three and every package they require (by this
machine's metadata) are left out, and so are wandb and matplotlib with what only they
need (jobs log to metrics.jsonl without wandb, and write no loss_curve.png without
matplotlib, which mosaicml-streaming declares but never imports; `--with-wandb` and
`--with-matplotlib` add them: matplotlib with its fonts and images is 17 MiB, a third of
a kit, and a device machine may take 64 MiB a call with the repository).
`--with-peft` adds the `peft` package and what it needs, for the acceptance's HF + PEFT
comparison (benchmarks/gpu_acceptance.py). mosaicml-streaming imports torchvision when
it is imported: for a machine whose torch comes without it, `--machine-torch 2.11.0`
adds the torchvision built for that torch (0.26.0; 7.2 MiB) and what it imports
(pillow, 6.8 MiB).

Left out, and why:
- torch, torchvision, triton and the CUDA libraries (nvidia-*, cuda-*): the GPU
  machine's own torch is used (pyproject.toml takes torch as a range for that);
- the cloud-storage SDKs mosaicml-streaming declares (S3, GCS, Azure, OCI, SFTP): MDS
  datasets on local or shared disk need none; add them by hand for remote datasets;
- TransformerEngine (the `gpu` extra): `transformer-engine-torch` compiles against the
  installed torch, so it is built on the GPU machine (docs/gpu-machines.md).

A package published only as a source distribution (hydra's antlr4-python3-runtime) is
built into a wheel here with `pip wheel`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = "audiollm"
# The GPU machine's own torch stack.
BROUGHT_BY_THE_GPU_MACHINE = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$")
# What a GPU machine image typically brings beside torch (the `--kit` mode leaves these
# and their requirements out).
KIT_MACHINE_BRINGS = ("torch", "transformers", "numpy")
# mosaicml-streaming's remote-storage back ends, not needed for datasets on disk.
CLOUD_STORAGE = re.compile(r"^(boto3|botocore|s3transfer|azure-.*|google-cloud-storage|oci|paramiko)$")


def target_environment(python: str) -> dict:
    """Marker environment of the target: Python `python` (e.g. "3.12") on x86-64 Linux."""
    env = default_environment()
    env.update(python_version=python, python_full_version=f"{python}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", os_name="posix",
               implementation_name="cpython", platform_python_implementation="CPython")
    return env


def _excluded(name: str) -> bool:
    return bool(BROUGHT_BY_THE_GPU_MACHINE.match(name) or CLOUD_STORAGE.match(name))


def job_side_closure(python: str = "3.12", brought: frozenset = frozenset()) -> dict[str, str]:
    """{package: installed version} of everything the project requires (without extras),
    transitively, for the target Python, minus what is left out (module docstring) and
    minus `brought` (names the target machine has, whose requirements are not followed)."""
    return _closure([PROJECT], python, lambda name: _excluded(name) or name in brought, include_roots=False)


def machine_brings(packages=KIT_MACHINE_BRINGS, python: str = "3.12") -> frozenset:
    """Names of `packages` and everything they require (by the installed metadata)."""
    return frozenset(_closure(packages, python, lambda name: False, include_roots=True))


def kit_closure(python: str = "3.12", with_wandb: bool = False, with_peft: bool = False,
                with_matplotlib: bool = False) -> dict[str, str]:
    """What `--kit` writes: the job side minus what the machine brings (and wandb and
    matplotlib unless asked for: the job runs without them), plus peft and its
    requirements with `with_peft`."""
    optional = {"wandb": with_wandb, "matplotlib": with_matplotlib}
    brought = machine_brings(python=python) | {name for name, wanted in optional.items() if not wanted}
    closure = job_side_closure(python, brought)
    if with_peft:
        closure.update(_closure(["peft"], python, lambda name: _excluded(name) or name in brought, include_roots=True))
    return dict(sorted(closure.items()))


def _closure(roots, python: str, skip, include_roots: bool) -> dict[str, str]:
    env = target_environment(python)
    found: dict[str, str] = {}
    for root in roots:
        try:
            importlib.metadata.version(root)
        except importlib.metadata.PackageNotFoundError:
            how = "`bash setup.sh` first" if root == PROJECT else f"`bash setup.sh --test` first (the test extra has {root})"
            raise SystemExit(f"{root} is not installed here, so its wheels cannot be gathered: run {how} on this "
                             f"connected machine") from None
    pending = [Requirement(r) for root in roots for r in importlib.metadata.requires(root) or []]
    if include_roots:
        pending += [Requirement(root) for root in roots]
    while pending:
        req = pending.pop()
        name = canonicalize_name(req.name)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        if name in found or skip(name):
            continue
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise SystemExit(f"{name} (required by the project) is not installed here: run `bash setup.sh` "
                             f"on this connected machine first") from None
        found[name] = version
        pending.extend(Requirement(r) for r in importlib.metadata.requires(name) or [])
    return dict(sorted(found.items()))


def with_machine_torchvision(closure: dict[str, str], torch_version: str, python: str = "3.12") -> dict[str, str]:
    """`closure` plus the torchvision built for the machine's torch and what torchvision
    requires beyond the machine's own packages (pillow: torchvision imports it at import)."""
    brought = machine_brings(python=python)
    needs = _closure(["torchvision"], python, lambda name: _excluded(name) or name in brought, include_roots=False)
    return {**closure, **needs, "torchvision": torchvision_for(torch_version)}


def torchvision_for(torch_version: str) -> str:
    """The torchvision release built for a torch release: 2.M.P -> 0.(M+15).P (2.11.0 ->
    0.26.0, 2.14.1 -> 0.29.1), the pairing torchvision's own compatibility table follows."""
    major, minor, patch = (int(part) for part in torch_version.split("+")[0].split(".")[:3])
    if major != 2:
        raise SystemExit(f"--machine-torch {torch_version}: only torch 2.x releases are paired with torchvision here")
    return f"0.{minor + 15}.{patch}"


# pip matches --platform tags exactly: name every manylinux level a glibc 2.28 machine runs.
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
             *(f"manylinux_2_{minor}_x86_64" for minor in range(5, 29)), "any"]


def _fetch_command(python: str, dest: Path, pins: list[str]) -> list[str]:
    """pip download of binary wheels for the target Python on x86-64 Linux."""
    abi = "cp" + python.replace(".", "")
    return [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
            "--python-version", python, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none",
            *(arg for platform in PLATFORMS for arg in ("--platform", platform)), *pins]


# pip's words for a pin with no wheel for the target.
_NO_WHEEL = re.compile(r"(?:No matching distribution found for|Could not find a version that satisfies the "
                       r"requirement) (\S+?)==")


def _download_all(closure: dict[str, str], python: str, dest: Path) -> list[str]:
    """Fetch a binary wheel of every package in one pip process (a pip start costs about
    a second of CPU; one per package was most of this command's time); a package pip
    names as having none is left to `_download` (built here), then the rest fetched
    again. Returns the names built here."""
    pending, built = dict(closure), []
    while pending:
        proc = subprocess.run(_fetch_command(python, dest, [f"{n}=={v}" for n, v in pending.items()]),
                              capture_output=True, text=True)
        if proc.returncode == 0:
            break
        named = _NO_WHEEL.search(proc.stderr)
        missing = next((n for n in pending if named and canonicalize_name(n) == canonicalize_name(named[1])), None)
        if missing is None:  # another failure: one package at a time says which, and why
            return built + [n for n, v in pending.items() if _download(n, v, python, dest) != "wheel"]
        if _download(missing, pending.pop(missing), python, dest) != "wheel":
            built.append(missing)
    return built


def _download(name: str, version: str, python: str, dest: Path) -> str:
    """Fetch one binary wheel for the target; build one from source where none exists
    (only a pure-Python wheel is of use: this machine's Python may not be the target's)."""
    if subprocess.run(_fetch_command(python, dest, [f"{name}=={version}"]), capture_output=True,
                      text=True).returncode == 0:
        return "wheel"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(dest), f"{name}=={version}"]
    proc = subprocess.run(build, capture_output=True, text=True)
    wheel = next(iter(sorted(dest.glob(f"{canonicalize_name(name).replace('-', '_')}-{version}-*.whl"))), None)
    if proc.returncode != 0 or wheel is None or not wheel.name.endswith("-none-any.whl"):
        if wheel is not None:
            wheel.unlink()
        raise SystemExit(f"{name}=={version}: no wheel for Python {python} on x86-64 Linux in the index, and "
                         f"no pure-Python wheel could be built here:\n{proc.stderr[-2000:]}")
    return "built here"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="audiollm wheels", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path, help="folder to write the wheels into")
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument("--list", action="store_true", help="only print the packages and versions")
    parser.add_argument("--kit", action="store_true",
                        help="only what a machine with its own torch, transformers and numpy lacks")
    parser.add_argument("--with-wandb", action="store_true", help="with --kit: add wandb and what it needs")
    parser.add_argument("--with-matplotlib", action="store_true",
                        help="with --kit: add matplotlib and what it needs (the job's loss_curve.png)")
    parser.add_argument("--with-peft", action="store_true",
                        help="with --kit: add peft and what it needs (the acceptance's HF + PEFT comparison)")
    parser.add_argument("--machine-torch", metavar="VERSION",
                        help="add the torchvision of this torch (e.g. 2.11.0) for a machine that has none")
    args = parser.parse_args(argv)
    closure = (kit_closure(args.python, args.with_wandb, args.with_peft, args.with_matplotlib) if args.kit
               else job_side_closure(args.python))
    if args.machine_torch:
        closure = with_machine_torchvision(closure, args.machine_torch, args.python)
    if args.list:
        for name, version in closure.items():
            print(f"{name}=={version}")
        return 0
    args.dest.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(args.dest), str(repo)], check=True)
    built = _download_all(closure, args.python, args.dest)
    size = sum(p.stat().st_size for p in args.dest.glob("*.whl")) / 2**20
    print(f"{len(closure) + 1} wheels for Python {args.python} in {args.dest} ({size:.1f} MiB)"
          + (f"; built here from source: {', '.join(built)}" if built else ""))
    print(f"on the GPU machine: bash setup.sh --from-wheels {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
