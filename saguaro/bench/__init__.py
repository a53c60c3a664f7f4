"""Benchmark suite: `saguaro bench` (entry point :func:`saguaro.bench.main.bench_main`).

Modules, in the order a run uses them: ``config`` (settings and CLI), ``datasets`` and
``prompts`` (what is asked), ``plan`` (variants, batches, request parameters), ``backends``
(saguaro's LLM and transformers' assisted generation), ``measure`` (the timed loop), ``check``
(greedy equality with AR), ``aggregate`` (rows, step and round costs), ``provenance``,
``tables``, ``plots`` and ``report`` (the output files).
"""

from saguaro.bench.main import bench_main

__all__ = ["bench_main"]
