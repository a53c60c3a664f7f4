"""The serving benchmark's work without the server: ShareGPT prompts (the serve bench's own
selection) through ``LLM.generate``, 64 tokens each, greedy, and the time a step spends
proposing, in the target's forward and verifying. Compares AR with SD and SSD as a server runs
them (``ar_fallback``) where the server's numbers differ.

    PYTHONPATH=. python docs/bench/serve/xeon-rounds/offline.py MODE [REQUESTS [SEQS [prefault]]]
"""

from __future__ import annotations

import sys
import time

import saguaro.engine.engine as engine_module
from saguaro.api import LLM
from saguaro.bench.serve import parse_config, prompt_texts
from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL
from saguaro.sampling.params import SamplingParams

MAX_TOKENS = 64
MAX_MODEL_LEN = 2048


def timed(times: dict[str, float], name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        times[name] += time.perf_counter() - start
        return out

    return wrapper


def main() -> None:
    mode = sys.argv[1]
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    seqs = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    speculative = mode != "ar"
    llm = LLM(
        model=DEFAULT_MODEL,
        draft=DEFAULT_DRAFT if speculative else None,
        mode=mode,
        max_num_seqs=seqs,
        max_model_len=MAX_MODEL_LEN,
        kv_prefault="prefault" in sys.argv,
        ar_fallback=speculative,
    )
    texts = prompt_texts(parse_config([]), requests + 1)[1:]
    prompts = [llm.tokenizer.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    engine = llm.engine
    times = dict.fromkeys(("step", "propose", "forward", "verify"), 0.0)
    engine.step = timed(times, "step", engine.step)
    engine._propose = timed(times, "propose", engine._propose)
    engine.runner.forward = timed(times, "forward", engine.runner.forward)
    engine_module.verify_step = timed(times, "verify", engine_module.verify_step)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    seconds = {k: round(v, 1) for k, v in times.items()}
    print(f"{mode}: {elapsed:.1f} s, {engine.num_steps} steps, {seconds}")


if __name__ == "__main__":
    main()
