"""The engine loop: schedule -> propose -> score -> verify -> commit.

One step serves every scheduled sequence with a single target forward. Sequences still
prefilling feed a chunk of their prompt; sequences at their last token run a round: the proposer
(none for AR, the draft for SD, the draft worker for SSD) supplies k proposals, the target scores
``[r, s_1..s_k]``, :func:`saguaro.sampling.verify` accepts a prefix and draws the recovery/bonus
token, and all k + 1 tokens are committed in the same step, each checked against the stop
conditions, so EOS and stop strings end a request at once.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from saguaro import placement
from saguaro.config import EngineConfig
from saguaro.core.proposal import DraftHealth, DraftSetup, Proposal, Proposer, ProposerFactory
from saguaro.core.records import RoundRecord
from saguaro.core.sequence import Sequence, Status
from saguaro.core.snapshot import EngineSnapshot, StepTimes
from saguaro.engine.block_manager import BlockManager
from saguaro.engine.detokenizer import Detokenizer
from saguaro.engine.loading import kv_report, load_target
from saguaro.engine.model_runner import ForwardClock, ModelRunner, time_forward
from saguaro.engine.scheduler import Scheduled, Scheduler
from saguaro.engine.tensor_parallel import TensorParallelTarget, rank_placements
from saguaro.engine.verification import verify_step
from saguaro.errors import DraftWorkerError, RequestError, TensorParallelError
from saguaro.sampling import SamplingParams, SamplingTensors
from saguaro.sampling.logprobs import TokenLogprob, token_logprobs
from saguaro.sampling.noise import sample_seed
from saguaro.sampling.processors import Processors
from saguaro.sampling.round import Verifier, verifier
from saguaro.sampling.structured import GrammarCompiler

log = logging.getLogger("saguaro")


def note_proposal(record: RoundRecord, proposal: Proposal, j: int, draft_s: float) -> None:
    """What a round's record says of its proposal (row ``j`` of ``proposal``) and of the
    drafting's time, ``draft_s`` (its share)."""
    record.mode, record.draft_s, record.wait_s = proposal.mode, draft_s, proposal.wait_s
    record.hit = proposal.hit[j] if proposal.hit else None
    record.backup = proposal.backup[j] if proposal.backup else None


def engine_placement(cfg: EngineConfig) -> placement.Placement | None:
    """On CPU: SSD's target keeps its own cores (the draft worker has the others); AR and SD use
    every core the process had; a tensor-parallel target's rank 0 the first share of them. One
    torch thread per core unless ``num_threads`` says otherwise. None on a GPU (the process's
    cores are left as they are)."""
    places = rank_placements(cfg)
    return places[0] if places else None


def bad_word_variants(words: list[str]) -> list[str]:
    """Each bad word as it starts a text and as it follows a space (most tokenizers spell the
    two differently), without duplicates."""
    out: list[str] = []
    for w in words:
        for v in (w.lstrip(), " " + w.lstrip()):
            if v not in out:
                out.append(v)
    return out


class LLMEngine:
    """One target model, its KV cache and scheduler; ``make_proposer`` builds the strategy for
    modes sd and ssd (:func:`saguaro.speculation.factory.make_proposer`)."""

    def __init__(self, cfg: EngineConfig, make_proposer: ProposerFactory | None = None) -> None:
        if cfg.mode != "ar" and make_proposer is None:
            raise ValueError(f"mode {cfg.mode!r} needs a proposer factory")
        self.cfg = cfg
        self._make_proposer = make_proposer
        self.proposer: Proposer | None = None
        # A sampling method's verifier. Only the bench replaces it, on engines of its own
        # (saguaro.bench.synthetic): no setting reaches it from a request or a server.
        self.verifier_for: Callable[[str], Verifier] = verifier
        self.tensor_parallel: TensorParallelTarget | None = None
        self.placement = engine_placement(cfg)
        if self.placement is not None:
            placement.place(self, self.placement)
        try:
            self._build(cfg)
        except BaseException:
            self.close()  # a failed start leaves the process as it found it
            raise
        self.draft_failure: str | None = None  # why a proposer was dropped for good
        self.num_steps = 0
        self.times = StepTimes()
        self.seqs: dict[int, Sequence] = {}  # unfinished requests
        # n > 1: the samples after the first, held until it has computed their shared prompt
        self._forks: dict[int, tuple[Sequence, list[Sequence]]] = {}
        self._ids = itertools.count()
        self._seed_rng = torch.Generator().manual_seed(cfg.seed)

    def _build(self, cfg: EngineConfig) -> None:
        """Load and size the target (:func:`~saguaro.engine.loading.load_target`), then build
        the KV blocks' manager, the scheduler and the proposer around it."""
        built = load_target(cfg)
        self.tensor_parallel = built.tensor_parallel  # closed by close() if the rest fails
        self.target_dir, self.draft_dir = built.target_dir, built.draft_dir
        self.tokenizer, self.model_config = built.tokenizer, built.model_config
        self.max_model_len, self.eos_token_ids = built.max_model_len, built.eos_token_ids
        self.runner = built.runner
        per_block = ModelRunner.kv_bytes_per_block(self.runner.model, cfg.block_size)
        self.kv_report = kv_report(built.num_blocks, cfg.block_size, per_block, self.max_model_len)
        self.block_manager = BlockManager(
            built.num_blocks, cfg.block_size, cfg.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager,
            cfg.max_num_seqs,
            cfg.max_num_batched_tokens,
            self.max_model_len,
            cfg.lookahead,
            on_preempt=self._on_preempt,
        )
        self.detok = Detokenizer(self.tokenizer)
        vocab_size = built.model_config.vocab_size
        self.grammars = GrammarCompiler(
            self.tokenizer.to_json(), vocab_size, sorted(self.eos_token_ids)
        )
        if cfg.mode != "ar" and self._make_proposer is not None:
            setup = DraftSetup(built.draft_dir, self.max_model_len, vocab_size, built.num_blocks)
            self.proposer = self._make_proposer(cfg, setup)
            self.proposer.calibrate(self._time_target)

    def _time_target(self, num_seqs: int, positions: int) -> float:
        """A proposer's probe of the target's cost (before serving: see time_forward)."""
        return time_forward(self.runner, num_seqs, positions)

    # ---- requests ---------------------------------------------------------------------------

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        """Tokenise and validate a prompt; raises RequestError before any work starts."""
        if isinstance(prompt, str):
            if not prompt:
                raise RequestError("prompt is empty")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
            vocab = self.model_config.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise RequestError(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
        if not ids:
            raise RequestError("prompt is empty")
        if len(ids) >= self.max_model_len:
            raise RequestError(
                f"prompt has {len(ids)} tokens; max_model_len is {self.max_model_len} "
                "(room is needed for at least one generated token)"
            )
        return ids

    def add_request(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        """Schedule one request (``params.n`` must be 1: :meth:`add_samples` takes any n)."""
        if params.n != 1:
            raise RequestError(f"add_request takes one sample (n=1), got n={params.n}")
        seq = self._new_sequence(prompt_ids, params)
        self.scheduler.add(seq)
        return seq

    def add_samples(self, prompt_ids: list[int], params: SamplingParams) -> list[Sequence]:
        """``params.n`` samples of one prompt, each with its own noise stream (a seeded
        request's sample i is keyed by :func:`~saguaro.sampling.noise.sample_seed`). The first
        is scheduled at once; the others wait until it has computed the prompt, then take its
        full KV blocks from the prefix cache and compute only the last, partial one."""
        samples = [
            replace(
                params,
                n=1,
                seed=None if params.seed is None else sample_seed(params.seed, i),
                # the prompt is scored once, by the first sample; the others share its blocks
                prompt_logprobs=params.prompt_logprobs if i == 0 else None,
            )
            for i in range(params.n)
        ]
        rest = [self._new_sequence(prompt_ids, p) for p in samples[1:]]
        first = self.add_request(prompt_ids, samples[0])
        if rest:
            self._forks[first.seq_id] = (first, rest)
        return [first, *rest]

    def _new_sequence(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        if self.failure is not None:
            raise TensorParallelError(self.failure)
        seed = (
            params.seed
            if params.seed is not None
            else int(torch.randint(0, 2**62, (1,), generator=self._seed_rng))
        )
        seq = Sequence(
            seq_id=next(self._ids),
            token_ids=list(prompt_ids),
            num_prompt_tokens=len(prompt_ids),
            params=params,
            seed=seed,
            eos_token_ids=self.eos_token_ids,
            processors=self._processors(prompt_ids, params),
            logprobs=None if params.logprobs is None else [],
            prompt_logprobs=None if params.prompt_logprobs is None else [None] * len(prompt_ids),
        )
        self.seqs[seq.seq_id] = seq
        self.detok.start(seq)
        return seq

    def _processors(self, prompt_ids: list[int], params: SamplingParams) -> Processors | None:
        """The request's logits processors; RequestError for token ids the model lacks."""
        vocab = self.model_config.vocab_size
        stop = [*params.stop_token_ids, *([] if params.ignore_eos else self.eos_token_ids)]
        words = [
            self.tokenizer.encode(w, add_special_tokens=False)
            for w in bad_word_variants(params.bad_words or [])
        ]
        try:
            grammar = None
            if params.structured is not None:
                grammar = self.grammars.compile(params.structured)
            stop = [t for t in stop if t < vocab]
            return Processors.build(params, prompt_ids, vocab, stop, words, grammar)
        except ValueError as e:
            raise RequestError(str(e)) from e

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """RequestError if ``params`` cannot be served (a token id the model lacks, a grammar
        that does not compile): what ``add_request`` would raise, without adding it."""
        self._processors(prompt_ids, params)

    def _release_forks(self) -> None:
        """Schedule the waiting samples of every request whose first sample has computed the
        prompt (it has committed a token) or has ended."""
        for key, (first, rest) in list(self._forks.items()):
            if first.is_finished or first.num_output_tokens:
                del self._forks[key]
                for seq in rest:
                    if not seq.is_finished:
                        self.scheduler.add(seq)

    def abort(self, seq_id: int) -> None:
        seq = self.seqs.get(seq_id)
        if seq is not None and not seq.is_finished:
            seq.status, seq.finish_reason = Status.FINISHED, "abort"
            self._release(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def close(self) -> None:
        if self.proposer is not None:
            self.proposer.close()
        if self.tensor_parallel is not None:
            self.tensor_parallel.close()
        placement.release(self)

    @property
    def failure(self) -> str | None:
        """Why the engine cannot step any more (a rank of its tensor-parallel target failed)."""
        return self.tensor_parallel.failure if self.tensor_parallel is not None else None

    def draft_health(self) -> DraftHealth:
        """The draft's state: ``none`` (AR), else the proposer's (running, restarting, failed);
        ``failed`` once a proposer that cannot recover has been dropped."""
        if self.proposer is not None:
            return self.proposer.health()
        if self.draft_failure is not None:
            return DraftHealth("failed", 0, self.draft_failure)
        return DraftHealth("none")

    def _drop_proposer(self, why: Exception) -> None:
        """The draft is gone for good: go on exactly without speculation (AR)."""
        log.warning("saguaro: %s; continuing without speculation (AR)", why)
        assert self.proposer is not None
        self.proposer.close(failed=True)
        self.proposer = None
        self.scheduler.lookahead = 0
        self.draft_failure = str(why)

    def snapshot(self) -> EngineSnapshot:
        """A read-only view of the engine's state. Safe to call from another thread while the
        engine steps: it reads counters and queue lengths only."""
        bm, sched = self.block_manager, self.scheduler
        draft = self.draft_health()
        return EngineSnapshot(
            mode=self.cfg.mode,
            lookahead=self.cfg.lookahead,
            num_steps=self.num_steps,
            running=len(sched.running),
            waiting=len(sched.waiting),
            sequences=len(self.seqs),
            num_preemptions=sched.num_preemptions,
            kv_blocks_total=bm.num_blocks,
            kv_blocks_free=bm.num_free_blocks,
            prefix_hit_tokens=bm.prefix_hit_tokens,
            draft_state=draft.state,
            draft_restarts=draft.restarts,
            draft_failure=draft.failure,
            tensor_parallel_size=self.cfg.tensor_parallel_size,
            failure=self.failure,
            times=replace(self.times),
        )

    def draft_stats(self, batch: int) -> dict:
        """The running proposer's own figures for a batch of ``batch`` (empty: none)."""
        return self.proposer.stats(batch) if self.proposer is not None else {}

    def stream_text(self, seq: Sequence) -> str:
        """The text of ``seq`` safe to show so far (held back while a stop string may form)."""
        return seq.text if seq.is_finished else self.detok.stream_text(seq)

    # ---- one step -----------------------------------------------------------------------------

    def step(self) -> list[Sequence]:
        """Run one engine step; return the sequences that committed tokens or finished."""
        step_start = time.perf_counter()
        try:
            return self._step(step_start)
        finally:
            self.times.step_s += time.perf_counter() - step_start

    def _step(self, step_start: float) -> list[Sequence]:
        if self.failure is not None:
            raise TensorParallelError(self.failure)
        if self.placement is not None:  # another engine may have run in this process since
            placement.place(self, self.placement)
        batch = self.scheduler.schedule()
        if not batch:
            return []
        self.num_steps += 1
        rounds = [s for s in batch if s.decode]
        spec = [s for s in rounds if s.k > 0]
        t0 = time.perf_counter()
        proposal = self._propose(spec)
        t1 = time.perf_counter()
        self.times.propose_s += t1 - t0
        clock = ForwardClock(self.runner)
        row = {s.seq.seq_id: i for i, s in enumerate(spec)}  # round -> its proposal row
        queries, prompt_rows = self._queries(batch, row, proposal)
        logits = self.runner.forward(queries)
        clock.stop()
        if prompt_rows:
            logits = self._score_prompts(logits, prompt_rows)
        for s in batch:
            if not s.decode:
                s.seq.num_computed_tokens += s.num_new_tokens
                self._register(s.seq)
        if not rounds:
            self.times.forward_s += clock.seconds()
            return []
        self._verify_and_commit(rounds, row, proposal, logits, t1 - t0, clock)
        self._release_forks()
        step_s = (time.perf_counter() - step_start) / len(rounds)
        for s in rounds:  # a failed request recorded no round
            if s.seq.records and s.seq.records[-1].step == self.num_steps:
                s.seq.records[-1].step_s = step_s
        if spec and self.proposer is not None:
            positions = sum(len(q.token_ids) for q in queries)
            self.proposer.observe([s.seq for s in spec], clock.seconds(), positions)
        return [s.seq for s in rounds]

    def _propose(self, spec: list[Scheduled]) -> Proposal | None:
        """The proposer's proposals for the rounds ``spec``, each round's k cut to what it
        offered; None where no round speculates or the draft is gone for good (every k is then
        0, and the step runs as AR)."""
        if not spec:
            return None
        assert self.proposer is not None
        try:
            proposal = self.proposer.propose([s.seq for s in spec], [s.k for s in spec])
        except DraftWorkerError as e:
            self._drop_proposer(e)
            proposal = None
        # A proposer may offer fewer than k tokens (a short n-gram match, or none at all).
        for i, s in enumerate(spec):
            s.k = int(proposal.num_draft[i]) if proposal is not None else 0
        return proposal

    def _queries(
        self, batch: list[Scheduled], row: dict[int, int], proposal: Proposal | None
    ) -> tuple[list, list[tuple[Sequence, int, int, int]]]:
        """One query per scheduled sequence: what it feeds (and proposes), scoring its round's
        K + 1 positions and, where a request reports its prompt's log-probabilities, every
        prompt position fed before the last. Returns the queries and, for those prompts,
        (sequence, first position, first logits row, rows)."""
        queries, prompt_rows, offset = [], [], 0
        for s in batch:
            seq = s.seq
            start = seq.num_computed_tokens
            tokens = seq.token_ids[start : start + s.num_new_tokens]
            if s.decode and s.k:
                tokens = tokens + proposal.tokens[row[seq.seq_id], : s.k].tolist()
            scored = s.k + 1 if s.decode else 0
            if seq.scores_prompt:  # position p scores prompt token p + 1
                n = min(start + s.num_new_tokens, seq.num_prompt_tokens - 1) - start
                if n > 0:
                    prompt_rows.append((seq, start, offset, n))
                    scored += n
            queries.append(self.runner.sequence_query(seq.block_table, start, tokens, scored))
            offset += scored
        return queries, prompt_rows

    def _score_prompts(
        self, logits: torch.Tensor, prompt_rows: list[tuple[Sequence, int, int, int]]
    ) -> torch.Tensor:
        """Record the prompt log-probabilities (raw) of ``prompt_rows``; return the other rows,
        the rounds', in order."""
        taken = torch.zeros(len(logits), dtype=torch.bool)
        for seq, start, first, n in prompt_rows:
            k = seq.params.prompt_logprobs
            assert seq.prompt_logprobs is not None and k is not None
            st = SamplingTensors.from_params([seq.params] * n)
            tokens = seq.token_ids[start + 1 : start + 1 + n]
            found = token_logprobs(logits[first : first + n], tokens, st, [k] * n, "raw")
            seq.prompt_logprobs[start + 1 : start + 1 + n] = found
            taken[first : first + n] = True
        return logits[(~taken).nonzero()[:, 0].to(logits.device)]

    def _verify_and_commit(
        self,
        rounds: list[Scheduled],
        row: dict[int, int],
        proposal: Proposal | None,
        logits: torch.Tensor,
        draft_s: float,
        clock: ForwardClock,
    ) -> None:
        """Verify the step's rounds (:func:`~saguaro.engine.verification.verify_step`) and
        apply each one's outcome: commit its tokens and record the round, or end its request
        with the error it met."""
        n = len(rounds)
        verify_start = time.perf_counter()
        verdict = verify_step(rounds, row, proposal, logits, self.cfg.sampling, self.verifier_for)
        out = verdict.outcomes
        target_s = clock.seconds()  # read once the outcome's copy has waited for the GPU
        self.times.forward_s += target_s
        now = time.perf_counter()
        verify_s = (now - verify_start) / n
        for i, s in enumerate(rounds):
            seq = s.seq
            error = out.errors[i]
            if error is not None:
                self._fail(seq, error, now)
                continue
            written = len(seq) + s.k  # target KV now covers r, s_1..s_k
            count = self._commit(seq, verdict.committed[i], verdict.logprobs[i], now)
            record = RoundRecord(
                num_drafted=s.k,
                num_accepted=out.num_accepted[i],
                token=verdict.committed[i][-1],
                committed=count,
                step=self.num_steps,
                target_s=target_s / n,
                verify_s=verify_s,
            )
            j = row.get(seq.seq_id) if proposal is not None else None
            if proposal is not None and j is not None:
                note_proposal(record, proposal, j, draft_s / len(row))
            seq.records.append(record)
            self._settle(seq, written, now)

    def _commit(
        self, seq: Sequence, new: list[int], logprobs: list[TokenLogprob], now: float
    ) -> int:
        """Append a round's tokens to ``seq`` until it finishes; how many went in."""
        count = 0
        for tok in new:
            seq.token_ids.append(tok)
            count += 1
            self.detok.append_token(seq, self.max_model_len)
            if seq.is_finished:
                break
        if seq.logprobs is not None:
            seq.logprobs.extend(logprobs[:count])
        if seq.first_token_time is None:
            seq.first_token_time = now
        return count

    def _settle(self, seq: Sequence, written: int, now: float) -> None:
        """Roll ``seq``'s KV back to its tokens and hash its full blocks for the prefix cache
        (a finished one's too, before it is released: its last round's KV serves a later
        prompt that starts with its text), then release it if it finished. The target wrote
        ``written`` positions, and those past the last accepted proposal hold rejected tokens."""
        seq.num_computed_tokens = min(written, len(seq) - 1)
        self.block_manager.trim(seq, len(seq))
        self._register(seq)
        if seq.is_finished:
            seq.finish_time = now
            self._release(seq)

    def _fail(self, seq: Sequence, why: str, now: float) -> None:
        """End one request with an error; the rest of its batch is untouched."""
        log.warning("saguaro: request %d failed: %s", seq.seq_id, why)
        seq.status, seq.finish_reason, seq.error = Status.FINISHED, "error", why
        seq.finish_time = now
        self._release(seq)

    def _register(self, seq: Sequence) -> None:
        ready = seq.num_computed_tokens
        draft = self.proposer.draft_ready(seq) if self.proposer is not None else None
        self.block_manager.register(seq, ready, draft)

    def _on_preempt(self, seq: Sequence) -> None:
        if self.proposer is not None:
            self.proposer.preempted(seq)

    def _release(self, seq: Sequence) -> None:
        """A finished request leaves nothing behind: whoever holds the sequence keeps it."""
        self.seqs.pop(seq.seq_id, None)
        self.scheduler.finish(seq)
        if seq.seq_id in self._forks:  # its samples need not wait for it any more
            self._release_forks()
        self.detok.drop(seq)
        if self.proposer is not None:
            self.proposer.release(seq)
