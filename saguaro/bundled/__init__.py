"""What the repository ships of the default pair: the draft trained for SmolLM2-135M-Instruct,
without the input embedding it shares with its target (saguaro.models.draft_dir makes it whole
when ``saguaro import-gguf --default`` imports the target)."""

from pathlib import Path

SMOLLM2_DRAFT_DIR: Path = Path(__file__).resolve().parent / "smollm2-135m-instruct-draft"
