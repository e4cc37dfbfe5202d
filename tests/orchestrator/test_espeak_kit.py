"""benchmarks/espeak_kit.py: espeak-ng carried to a machine without it (a lent GPU
machine, for the default run's corpus) speaks exactly as this machine's. Checked where the
system's espeak-ng, its voices and libpcaudio are hidden (a mount namespace), so that only
what the kit carries can speak."""

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import espeak_kit

MULTIARCH = Path("/") / espeak_kit.MULTIARCH
SAY = ["-v", "en-gb", "-s", "160", "-p", "40", "--stdout", "the frog watches the teacher, 4 0 7"]


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="the reference is this machine's espeak-ng")
def test_the_carried_espeak_speaks_as_this_machine_with_nothing_of_the_system_s(tmp_path):
    kit = tmp_path / "espeak"
    files = espeak_kit.make(kit)
    assert "stub/libpcaudio.so.0" in files and sum(f.endswith(".deb") for f in files) == len(espeak_kit.PACKAGES)
    env = {**os.environ, **espeak_kit.unpack(kit, tmp_path / "root")}
    reference = subprocess.run(["/usr/bin/espeak-ng", *SAY], capture_output=True, check=True).stdout
    hide = [f"mount --bind {tmp_path / 'empty'} {MULTIARCH / 'espeak-ng-data'}",
            f"mount --bind /dev/null {MULTIARCH / 'libpcaudio.so.0'}", "mount --bind /dev/null /usr/bin/espeak-ng"]
    (tmp_path / "empty").mkdir()
    script = " && ".join([*hide, "test ! -s /usr/bin/espeak-ng", "exec espeak-ng " + " ".join(f"'{a}'" for a in SAY)])
    carried = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, env=env)
    assert carried.returncode == 0, carried.stderr.decode()
    assert len(reference) > 10_000 and hashlib.sha256(carried.stdout).digest() == hashlib.sha256(reference).digest()
