"""espeak-ng for a machine without it and without a package index (a lent GPU machine), so
that the default run there makes its own demo corpus as README's first command does here.

    python3 benchmarks/espeak_kit.py .whl/espeak      # here (Debian or Ubuntu, x86-64): about 5 MB
    # there: benchmarks/gpu_session.py unpacks it (unpack(), no dpkg needed) before the default run

The corpus itself does not travel (tens of MB of audio beside a 50 MB kit, over a 64 MB
limit); espeak-ng and its voices do: Debian's packages of it (`apt-get download`, the
same version as here, so the corpus there is this machine's sample for sample) and, in
place of libpcaudio (which pulls PulseAudio and ALSA in), a stub of its eight functions:
espeak-ng links it for playback, and the corpus is written with --stdout, which never
plays. Standard library only.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGES = ("espeak-ng", "libespeak-ng1", "espeak-ng-data", "libsonic0")
STUB_DIR = "stub"  # the libpcaudio stand-in, first on LD_LIBRARY_PATH
MULTIARCH = "usr/lib/x86_64-linux-gnu"

# libpcaudio's API as libespeak-ng calls it (pcaudiolib/audio.h); no device is ever opened.
PCAUDIO_STUB = r"""
#include <stddef.h>
#include <stdint.h>
struct audio_object;
struct audio_object *create_audio_device_object(const char *d, const char *a, const char *s) { return NULL; }
int audio_object_open(struct audio_object *o, int format, uint32_t rate, uint8_t channels) { return -1; }
void audio_object_close(struct audio_object *o) {}
void audio_object_destroy(struct audio_object *o) {}
int audio_object_write(struct audio_object *o, const void *data, size_t bytes) { return -1; }
int audio_object_drain(struct audio_object *o) { return -1; }
int audio_object_flush(struct audio_object *o) { return -1; }
const char *audio_object_strerror(struct audio_object *o, int error) { return "no audio output (stub)"; }
"""


def make(out: Path) -> list:
    """Downloads the packages into `out` and builds the stub; the files written."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.deb"):
        old.unlink()
    subprocess.run(["apt-get", "download", *PACKAGES], cwd=out, check=True, capture_output=True)
    (out / STUB_DIR).mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "pcaudio_stub.c"
        source.write_text(PCAUDIO_STUB)
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libpcaudio.so.0", "-o",
                        str(out / STUB_DIR / "libpcaudio.so.0"), str(source)], check=True)
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def extract_deb(deb: Path, root: Path) -> None:
    """A .deb's files under `root`, as `dpkg -x` puts them, by the standard library alone
    (the machine it runs on may have no dpkg): an ar archive whose data.tar.* member holds
    the files."""
    blob = deb.read_bytes()
    if not blob.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb} is not a Debian package (no ar header)")
    at = 8
    while at + 60 <= len(blob):
        name, size = blob[at:at + 16].decode().strip().rstrip("/"), int(blob[at + 48:at + 58].decode())
        body = blob[at + 60:at + 60 + size]
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
                tar.extractall(root, filter="tar")
            return
        at += 60 + size + (size % 2)
    raise ValueError(f"{deb} holds no data.tar member")


def unpack(kit: Path, root: Path) -> dict:
    """The packages of `kit` unpacked under `root` (no installation); the environment that
    runs its espeak-ng (to merge into os.environ)."""
    if not (root / "usr" / "bin" / "espeak-ng").exists():
        for deb in sorted(kit.glob("*.deb")):
            extract_deb(deb, root)
    libs = os.pathsep.join([str((kit / STUB_DIR).resolve()), str(root / MULTIARCH)])
    return {"PATH": os.pathsep.join([str(root / "usr" / "bin"), os.environ.get("PATH", "")]),
            "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [libs, os.environ.get("LD_LIBRARY_PATH")])),
            # the folder that holds espeak-ng-data (the packaged path is compiled in)
            "ESPEAK_DATA_PATH": str(root / MULTIARCH)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if shutil.which("apt-get") is None or shutil.which("cc") is None:
        print("needs apt-get and a C compiler (Debian or Ubuntu, x86-64)", file=sys.stderr)
        return 2
    files = make(args.out)
    size = sum((args.out / f).stat().st_size for f in files)
    print(f"{args.out}: {len(files)} files, {size / 2**20:.1f} MiB: {', '.join(files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
