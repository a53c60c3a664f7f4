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


def test_shadow_chains_are_tallied_by_position():
    tally = worker_module.ShadowTally(4)
    tally.add(4, 2)  # positions 1 and 2 accepted, 3 rejected, 4 never reached
    tally.add(4, 4)
    tally.add(2, 2)  # a chain cut short by the context: both its positions accepted
    assert tally.tried == [3, 3, 2, 1] and tally.hits == [3, 3, 1, 1]


def test_a_fed_worker_keeps_current_and_its_shadow_chains_are_the_drafts_own(tiny_draft):
    """FEED: the target's AR steps, one token each. The worker drafts a shadow chain, the
    draft's greedy continuation; steps that commit it are counted as accepted through the
    chain's end, a step that leaves it settles it there, and a new chain follows."""
    k = 3
    worker = make_worker(tiny_draft, k, [1, 1, 1, 1])
    worker.take(P.Feed([P.SeqUpdate(0, [1, 2, 3, 4], new=True)]))
    never = lambda: False  # noqa: E731
    worker.draft_shadows(stop=never)
    seq = worker.seqs[0]
    chain = list(seq.spec)
    assert seq.shadow_len == k and (seq.computed, seq.written) == (3, 4 + k - 1)
    reference = LLM(model=str(tiny_draft), max_model_len=256)
    greedy = SamplingParams(temperature=0, max_tokens=k, ignore_eos=True)
    assert chain == reference.generate([[1, 2, 3, 4]], greedy)[0].token_ids
    for token in chain:  # the target's AR steps commit the chain, token by token
        worker.take(P.Feed([P.SeqUpdate(0, [token])]))
        worker.draft_shadows(stop=never)
    assert worker.shadow.tried == [1, 1, 1] and worker.shadow.hits == [1, 1, 1]
    assert seq.shadow_len == k  # the next chain, after the committed one
    wrong = (seq.spec[0] + 1) % 50
    worker.take(P.Feed([P.SeqUpdate(0, [wrong])], dropped=[]))
    assert worker.shadow.tried == [2, 1, 1] and worker.shadow.hits == [1, 1, 1]
    assert seq.token_ids == [1, 2, 3, 4, *chain, wrong] and seq.computed == len(seq.token_ids) - 1


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
