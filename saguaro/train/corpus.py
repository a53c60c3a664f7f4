"""The training corpus: the running interpreter's standard library, split by file. It lives in
:mod:`saguaro.corpus`, which the bench reads too; these names stay importable from here."""

from __future__ import annotations

from saguaro.corpus import EOT, Split, is_heldout, read_documents, split_files, stdlib_root

__all__ = ["EOT", "Split", "is_heldout", "read_documents", "split_files", "stdlib_root"]
