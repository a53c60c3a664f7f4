"""Benchmark suite: `saguaro bench` (see :mod:`saguaro.bench.runner`)."""

from saguaro.bench.runner import bench_main

__all__ = ["bench_main"]
