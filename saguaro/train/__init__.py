"""Trainer for the bundled draft/target pair (needs the `train` extra: transformers)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    # Imported lazily so `import saguaro.train` costs nothing without transformers.
    from saguaro.train.cli import main as cli_main

    return cli_main(argv)
