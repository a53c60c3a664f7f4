"""Training: a small code pair from scratch (`saguaro train-pair`) and a draft distilled for any
target (`saguaro train-draft`); both need the `train` extra (transformers)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    # Imported lazily so `import saguaro.train` costs nothing without transformers.
    from saguaro.train.cli import main as cli_main

    return cli_main(argv)
