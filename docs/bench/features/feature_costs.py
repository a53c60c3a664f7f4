"""What each sampling feature costs per token, and what structured output does to speculation.

    python docs/bench/features/feature_costs.py e2e [--rounds 3] [--max-tokens 64] [--out DIR]
    python docs/bench/features/feature_costs.py work [--rounds 5] [--out DIR]

``e2e`` runs the default pair (SmolLM2-135M-Instruct on its Q4 weights, vocabulary 49,152) in
AR, SD and SSD at batch 1 and 16 on 16 chat prompts asking for JSON, greedy, with each feature
in turn: none, logprobs (top 5), penalties (presence, frequency, repetition), a JSON schema.
A token's cost is the decode time per committed token (every round but each request's first,
whose step also prefills its prompt), and a feature's cost is the time the engine spends
sampling and verifying per token (``RoundRecord.verify_s``, which holds the processors, masks
and log-probabilities) above the plain configuration's, as a share of the plain token: whole
step times move by more than that between runs on a shared machine, and a schema's requests end
at different lengths, which changes the batch. Configurations are interleaved, medians over
rounds. Tokens per round show what the schema does to speculation.

``work`` times the features' own per-step work on random logits at vocabularies of 49,152
(SmolLM2's tokenizer) and 151,936 (a byte-level BPE of that size trained on ShareGPT text here,
cached in $SAGUARO_CACHE): penalties on the scored rows, log-probabilities with the top 5, and
the JSON schema's masks at points along a real JSON text.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from saguaro import LLM, SamplingParams
from saguaro.sampling import SamplingTensors
from saguaro.sampling.logprobs import token_logprobs
from saguaro.sampling.params import StructuredOutput
from saguaro.sampling.processors import Processors, apply_processors
from saguaro.sampling.structured import GrammarCompiler
from saguaro.train.costs import median_ms

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "year", "tags"],
}
SUBJECTS = [
    "the Eiffel Tower", "Python", "a cat", "the Moon", "jazz", "Linux", "a bicycle", "tea",
    "the Nile", "chess", "Mount Fuji", "a violin", "Rome", "the Internet", "coffee", "Mars",
]  # fmt: skip
FEATURES = {
    "none": {},
    "logprobs (top 5)": dict(logprobs=5),
    "penalties": dict(presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.1),
    "json schema": dict(structured=StructuredOutput("json", SCHEMA)),
}
MODES = {
    "ar": dict(mode="ar"),
    "sd": dict(mode="sd", num_speculative_tokens=4),
    "ssd": dict(mode="ssd", num_speculative_tokens=4),
}
BATCHES = (1, 16)
BIG_VOCAB = 151_936
MAX_TOKEN_CHARS = 16  # as real vocabularies: a trie of a few very long tokens breaks llguidance


def prompts(llm: LLM) -> list[list[int]]:
    return [
        llm.tokenizer.encode_chat(
            [{"role": "user", "content": f"Describe {s} as JSON with a name, a year and tags."}]
        )
        for s in SUBJECTS
    ]


def decode_cost(outs) -> tuple[float, float, float, int]:
    """(seconds per token, sampling seconds per token, tokens per round, tokens) over every
    round but each request's first."""
    rounds = [r for o in outs for r in o.records[1:]]
    tokens = max(sum(r.committed for r in rounds), 1)
    return (
        sum(r.step_s for r in rounds) / tokens,
        sum(r.verify_s for r in rounds) / tokens,
        tokens / max(len(rounds), 1),
        tokens,
    )


def e2e(args: argparse.Namespace) -> dict:
    results: dict = {}
    for mode, engine in MODES.items():
        with LLM(max_num_seqs=16, **engine) as llm:
            ids = prompts(llm)
            runs: dict[tuple[int, str], list[tuple[float, float, float, int]]] = {}
            for _ in range(args.rounds):
                for batch in BATCHES:
                    for name, kw in FEATURES.items():
                        params = SamplingParams(temperature=0, max_tokens=args.max_tokens, **kw)
                        group = ids[:4] if batch == 1 else ids
                        outs = []
                        for i in range(0, len(group), batch):
                            outs += llm.generate(group[i : i + batch], params)
                        runs.setdefault((batch, name), []).append(decode_cost(outs))
            for (batch, name), values in runs.items():
                plain = runs[(batch, "none")]
                token_ms = 1e3 * statistics.median(v[0] for v in plain)
                sampling_ms = 1e3 * statistics.median(v[1] for v in values)
                plain_sampling_ms = 1e3 * statistics.median(v[1] for v in plain)
                results[f"{mode} b{batch} {name}"] = {
                    "ms_per_token": 1e3 * statistics.median(v[0] for v in values),
                    "sampling_ms_per_token": sampling_ms,
                    "cost_share": (sampling_ms - plain_sampling_ms) / token_ms,
                    "tokens_per_round": statistics.median(v[2] for v in values),
                    "tokens": values[0][3],
                }
            print(json.dumps({k: v for k, v in results.items() if k.startswith(mode)}, indent=1))
    return results


def big_tokenizer(cache: Path) -> str:
    """A byte-level BPE of BIG_VOCAB tokens trained on ShareGPT text (cached)."""
    path = cache / f"sharegpt-bpe-{BIG_VOCAB}-max{MAX_TOKEN_CHARS}.json"
    if not path.is_file():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        from saguaro.bench.datasets import sharegpt_conversations

        def texts():
            for i, conv in enumerate(sharegpt_conversations()):
                if i >= 6000:
                    return
                for turn in conv.get("conversations", []):
                    if isinstance(turn.get("value"), str):
                        yield turn["value"]

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=BIG_VOCAB,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            max_token_length=MAX_TOKEN_CHARS,
            show_progress=False,
        )
        tok.train_from_iterator(texts(), trainer=trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(path))
    return path.read_text()


def work_cases(tokenizer_json: str, vocab: int, rows: int) -> dict[str, callable]:
    """Each feature's own work for one step of ``rows`` AR sequences (one scored row each)."""
    g = torch.Generator().manual_seed(vocab + rows)
    logits = torch.randn(rows, vocab, generator=g) * 3
    history = torch.randint(0, vocab, (rows, 200), generator=g).tolist()
    plain = SamplingParams(temperature=0)
    penal = SamplingParams(temperature=0, **FEATURES["penalties"])
    procs = [Processors.build(penal, h[:100], vocab, [0]) for h in history]
    st = SamplingTensors.from_params([plain] * rows)
    text = json.dumps({"name": "Mount Fuji", "year": 1707, "tags": ["volcano", "Japan"]})
    compiler = GrammarCompiler(tokenizer_json, vocab, [0])
    tokens = compiler.tokenizer.tokenize_str(text)
    states = []  # a matcher at each of four points along the text, for every row
    for i in range(4):
        for _ in range(rows):
            grammar = compiler.compile(StructuredOutput("json", SCHEMA))
            grammar.banned(tokens[: len(tokens) * i // 4], [], range(1))
            states.append(grammar)

    def masks() -> None:  # a step's work: the mask, as a bool tensor
        for grammar in states:
            grammar.banned(grammar_prefix[id(grammar)], [], range(1))

    grammar_prefix = {id(gr): tokens[: gr.consumed] for gr in states}

    return {
        "penalties": lambda: apply_processors(
            logits, procs, [h[100:] for h in history], [[]] * rows, [[i] for i in range(rows)]
        ),
        "logprobs (top 5)": lambda: token_logprobs(logits, [0] * rows, st, [5] * rows, "raw"),
        "json mask (per step, averaged over 4 points)": masks,
    }


def work(args: argparse.Namespace) -> dict:
    cache = Path(os.environ.get("SAGUARO_CACHE", "~/.cache/saguaro")).expanduser() / "bench"
    from saguaro.models.catalog import DEFAULT_MODEL, models_dir

    small = (models_dir() / DEFAULT_MODEL / "tokenizer.json").read_text()
    out: dict = {}
    for vocab, tok in ((49_152, small), (BIG_VOCAB, big_tokenizer(cache))):
        for rows in BATCHES:
            for name, fn in work_cases(tok, vocab, rows).items():
                ms = median_ms(fn, repeats=args.rounds)
                if name.startswith("json mask"):
                    ms /= 4  # four masks per row are timed
                out[f"V={vocab} rows={rows} {name}"] = ms
                print(f"V={vocab} rows={rows} {name}: {ms:.3f} ms", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", choices=("e2e", "work"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    start = time.time()
    results = e2e(args) if args.what == "e2e" else work(args)
    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus",
        "torch": torch.__version__,
        "args": vars(args) | {"out": str(args.out)},
        "seconds": round(time.time() - start),
        "results": results,
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.what}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
