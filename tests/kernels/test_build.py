"""The kernels' build flags follow the CPU: AVX-512 or AVX2, VNNI where it has it, and the
prefetch distance measured for its vendor."""

from __future__ import annotations

import pytest

from saguaro.kernels import build

AVX512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"}


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ({"avx2", "fma"}, ["-march=x86-64-v3"]),  # Zen 3
        ({"avx2", "fma", "avx_vnni"}, ["-march=x86-64-v3", "-mavxvnni"]),  # AVX-VNNI only
        (AVX512, ["-march=x86-64-v4"]),  # Skylake-X: no VNNI
        (AVX512 | {"avx512_vnni"}, ["-march=x86-64-v4", "-mavx512vnni"]),  # Zen 4, Xeon
        (AVX512 | {"avx512_vnni", "avx_vnni"}, ["-march=x86-64-v4", "-mavx512vnni"]),
        (  # Sapphire Rapids: AMX's int8 tiles
            AVX512 | {"avx512_vnni", "amx_tile", "amx_int8"},
            ["-march=x86-64-v4", "-mavx512vnni", "-mamx-tile", "-mamx-int8"],
        ),
        (AVX512 | {"avx512_vnni", "amx_tile", "amx_bf16"}, ["-march=x86-64-v4", "-mavx512vnni"]),
    ],
)
def test_march_takes_what_the_cpu_reports(monkeypatch, flags, want):
    monkeypatch.setattr(build, "cpu", lambda: ("AuthenticAMD", frozenset(flags)))
    assert build.march() == want


@pytest.mark.parametrize(
    ("vendor", "distance"), [("GenuineIntel", 2048), ("AuthenticAMD", 4096), ("", 4096)]
)
def test_prefetch_distance_is_the_vendors(monkeypatch, vendor, distance):
    monkeypatch.setattr(build, "cpu", lambda: (vendor, frozenset()))
    assert build.prefetch() == [f"-DPREFETCH_BYTES={distance}"]


def test_cpu_reads_the_vendor_and_flags_of_this_machine():
    vendor, flags = build.cpu()
    assert vendor in {"GenuineIntel", "AuthenticAMD"}
    assert "avx2" in flags
