from pathlib import Path

import pytest

# Varied enough for a few BPE merges, long enough for a handful of 32-token windows.
_SNIPPETS = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import os\n\n\ndef walk(root):\n\tfor name in os.listdir(root):\n\t\tyield name\n",
    "# comment with unicode: caf\u00e9 \u2192 \u03bb\nVALUE = {'k': [1, 2, 3]}  \n\n\n",
]


@pytest.fixture
def tiny_tree(tmp_path: Path) -> Path:
    root = tmp_path / "lib"
    for i in range(24):
        pkg = root / f"pkg{i % 4}"
        pkg.mkdir(parents=True, exist_ok=True)
        body = "".join(_SNIPPETS[(i + j) % len(_SNIPPETS)] for j in range(6))
        (pkg / f"mod{i}.py").write_text(f"# module {i}\n{body}", encoding="utf-8")
    (root / "site-packages" / "thirdparty").mkdir(parents=True)
    (root / "site-packages" / "thirdparty" / "x.py").write_text("x = 1\n")
    (root / "bad.py").write_bytes(b"s = '\xff\xfe'\n")  # not UTF-8: skipped
    return root
