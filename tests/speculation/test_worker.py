"""The draft worker, in process: rounds answered from the cache or a backup, sequences dropped,
and its command line."""

from __future__ import annotations

from saguaro import LLM, SamplingParams
from saguaro.config import EngineConfig
from saguaro.speculation import protocol as P
from saguaro.speculation import worker as worker_module
from tests.speculation.workers import make_worker


def test_outcomes_hit_and_miss(tiny_draft):
    k = 2
    worker = make_worker(tiny_draft, k, [2, 2, 2])
    worker.handle(P.RoundRequest([P.SeqUpdate(0, [1, 2, 3, 4], new=True)], backup="neural"))
    worker.build_pending()
    seq = worker.seqs[0]
    (kk, t), (branch, _) = next(iter(seq.cache.items()))
    committed = seq.spec[:kk] + [t]
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, committed)], backup="fast"))
    spec = reply.specs[0]
    assert spec.hit and spec.tokens == branch and spec.backup is None
    assert seq.token_ids == [1, 2, 3, 4] + committed
    worker.build_pending()
    # an outcome no branch prepared: (k=0, t=s_1), the drafted token is never a candidate
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, [seq.spec[0]])], backup="fast"))
    assert reply.specs[0].hit is False and reply.specs[0].backup == "fast"


def test_dropped_sequences_free_their_blocks(tiny_draft):
    worker = make_worker(tiny_draft, 2, [1, 1, 1])
    free = worker.bm.num_free_blocks
    worker.handle(P.RoundRequest([P.SeqUpdate(7, list(range(40)), new=True)]))
    worker.build_pending()
    assert worker.bm.num_free_blocks < free
    worker.handle(P.RoundRequest([], dropped=[7]))
    assert worker.bm.num_free_blocks == free and 7 not in worker.seqs


def test_tokens_committed_outside_a_round_are_a_miss(tiny_draft):
    """If the target commits more than one round's worth (rounds it ran without the worker),
    no branch may be used: each was sampled for one exact prefix."""
    k = 2
    worker = make_worker(tiny_draft, k, [3, 3, 3])
    worker.handle(P.RoundRequest([P.SeqUpdate(0, [1, 2, 3, 4], new=True)], backup="neural"))
    worker.build_pending()
    seq = worker.seqs[0]
    (kk, t), _ = next(iter(seq.cache.items()))
    extra = 5 if kk == 0 else seq.spec[0]
    committed = [extra] + seq.spec[:kk] + [t]  # one extra token ahead of the outcome
    reply = worker.handle(P.RoundRequest([P.SeqUpdate(0, committed)], backup="neural"))
    assert reply.specs[0].hit is False
    assert seq.token_ids == [1, 2, 3, 4] + committed
    reference = LLM(model=str(tiny_draft), max_model_len=256)
    greedy = SamplingParams(temperature=0, max_tokens=k, ignore_eos=True)
    assert reply.specs[0].tokens == reference.generate([seq.token_ids], greedy)[0].token_ids


def test_the_command_line_takes_its_defaults_from_the_engine(monkeypatch):
    """``--timeout`` defaults to the engine's draft_timeout_s, the address to its draft_addr."""
    joined = []

    class FakeChannel:
        def __init__(self, rank, addr, port, timeout_s):
            joined.append((rank, addr, port, timeout_s))

        def connect(self):
            return self

    monkeypatch.setattr(worker_module, "Channel", FakeChannel)
    monkeypatch.setattr(worker_module, "serve", lambda channel: None)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert worker_module.main(["--port", "1234"]) == 0
    assert worker_module.main(["--port", "1234", "--timeout", "2.5", "--addr", "h"]) == 0
    assert joined == [
        (1, EngineConfig.draft_addr, 1234, EngineConfig.draft_timeout_s),
        (1, "h", 1234, 2.5),
    ]
