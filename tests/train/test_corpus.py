import shutil
from pathlib import Path

from saguaro.corpus import is_heldout, read_documents, split_files


def test_split_is_by_file_deterministic_and_complete(tiny_tree: Path) -> None:
    a = split_files(tiny_tree, heldout_permille=300)
    b = split_files(tiny_tree, heldout_permille=300)
    assert a == b
    assert a.train and a.heldout
    assert not set(a.train) & set(a.heldout)
    rels = {p.relative_to(tiny_tree).as_posix() for p in a.train + a.heldout}
    assert "site-packages/thirdparty/x.py" not in rels
    assert len(rels) == 24 + 1  # the modules and bad.py; read_documents drops bad.py
    for p in a.heldout:
        assert is_heldout(p.relative_to(tiny_tree).as_posix(), 300)


def test_split_depends_only_on_relative_paths(tiny_tree: Path, tmp_path: Path) -> None:
    moved = tmp_path / "elsewhere"
    shutil.copytree(tiny_tree, moved)
    a, b = split_files(tiny_tree, 300), split_files(moved, 300)
    assert [p.relative_to(tiny_tree) for p in a.heldout] == [
        p.relative_to(moved) for p in b.heldout
    ]


def test_undecodable_files_are_skipped(tiny_tree: Path) -> None:
    docs = list(read_documents(sorted(tiny_tree.rglob("*.py"))))
    assert len(docs) == 24 + 1  # site-packages is only excluded by split_files
