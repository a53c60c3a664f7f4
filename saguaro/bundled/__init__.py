"""The bundled draft/target pair (Hugging Face directories shipped as package data)."""

from pathlib import Path

_HERE = Path(__file__).resolve().parent
TARGET_DIR: Path = _HERE / "target"
DRAFT_DIR: Path = _HERE / "draft"
