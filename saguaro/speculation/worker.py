"""The SSD draft worker process: one loop over the protocol in :mod:`saguaro.speculation.protocol`.

Per round it (1) reads each sequence's outcome ``(k, t)`` from the tokens the target committed,
(2) answers with the cached speculation on a hit, or with a backup on a miss
(:mod:`saguaro.speculation.backup`), and then, while the target verifies what it just received,
(3) builds the speculation cache for that round (:mod:`saguaro.speculation.cache_builder`,
docs/design.md §4). ``saguaro draft-worker`` and ``python -m saguaro.speculation.worker`` run it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from saguaro.config import EngineConfig
from saguaro.distributed.channel import Channel, ChannelError
from saguaro.distributed.processes import exit_now
from saguaro.engine.block_manager import BlockManager
from saguaro.engine.graphs import MAX_GRAPH_POSITIONS, graph_buckets
from saguaro.engine.model_runner import ForwardClock, ModelRunner
from saguaro.models.config import ModelConfig
from saguaro.models.loader import load_model
from saguaro.models.tokenizer import Tokenizer, has_tokenizer
from saguaro.sampling import SamplingParams
from saguaro.sampling.processors import Processors
from saguaro.sampling.structured import GrammarCompiler
from saguaro.speculation import protocol as P
from saguaro.speculation.backup import fast_backup, neural_backup
from saguaro.speculation.cache_builder import CacheBuilder, DraftSeq, kv_blocks

log = logging.getLogger("saguaro.worker")

# HELLO follows the rendezvous at once: this only bounds a target that joined and then hung.
HELLO_TIMEOUT_S = 600.0
# Between requests the target may idle for as long as nobody asks it anything; its death closes
# the socket, which ends the wait anyway.
IDLE_TIMEOUT_S = 7 * 24 * 3600.0
PR_SET_PDEATHSIG = 1  # prctl option, <linux/prctl.h>


def draft_grammars(draft_dir: Path, config: ModelConfig) -> GrammarCompiler | None:
    """Grammars over the draft's tokenizer (None: its directory has none, and structured
    requests are drafted unconstrained)."""
    if not has_tokenizer(draft_dir):
        return None
    tokenizer = Tokenizer(draft_dir)
    eos = set(config.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return GrammarCompiler(tokenizer.to_json(), config.vocab_size, sorted(eos))


def shadows(seq: DraftSeq) -> bool:
    """Whether ``seq``'s shadow chains measure its acceptance: committed tokens equal the
    draft's exactly when a verification would accept them (greedy, and coupled sampling's
    shared noise); under rejection sampling a verification accepts more than the equal ones."""
    return seq.params.greedy or seq.coupled


@dataclass
class ShadowTally:
    """Shadow chains settled since the target last read them: per position j, how many chains
    reached it (tried) and had its token committed (hits)."""

    k: int
    tried: list[int] = field(init=False)
    hits: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.clear()

    def add(self, drafted: int, accepted: int) -> None:
        for j in range(min(accepted + 1, drafted)):
            self.tried[j] += 1
            self.hits[j] += j < accepted

    def publish(self, channel: Channel) -> None:
        """Add the counts to the target's bells (protocol.shadow_bell) and start again."""
        for j in range(self.k):
            for kind, counts in (("tried", self.tried), ("hits", self.hits)):
                if counts[j]:
                    channel.ring(P.shadow_bell(kind, j), counts[j])
        self.clear()

    def clear(self) -> None:
        self.tried, self.hits = [0] * self.k, [0] * self.k


class DraftWorker:
    """The draft model, its KV pool and the worker's sequences; answers one round at a time."""

    def __init__(self, cfg: P.WorkerConfig) -> None:
        self.cfg = cfg
        if cfg.cpus:
            os.sched_setaffinity(0, cfg.cpus)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        model = load_model(
            cfg.draft_dir,
            cfg.dtype,
            cfg.device,
            quantization=cfg.quantization,
            kernels=cfg.kernels,
            draft=True,
            head_tokens=cfg.head_tokens,
        )
        self.vocab_size = model.config.vocab_size
        num_blocks = kv_blocks(cfg)
        self.bm = BlockManager(num_blocks, cfg.block_size, enable_prefix_caching=False)
        # The branch forwards' keys: a sequence's context and its branches' tokens (at most
        # MAX_GRAPH_POSITIONS branches of K + 1 tokens each within a graph's bucket).
        max_keys = cfg.max_model_len + MAX_GRAPH_POSITIONS * (cfg.k + 1)
        buckets = graph_buckets(cfg.graphs, cfg.max_num_seqs, max_keys, cfg.k)
        self.runner = ModelRunner(
            model,
            num_blocks,
            cfg.block_size,
            cfg.device,
            cfg.compile,
            buckets=buckets,
            prefault=cfg.prefault,
        )
        if cfg.compile:  # compile before any build is timed: compiling is not drafting
            self.runner.warm_up()
        # Backups and one-branch depths (1 position) and a glue pass over a speculation
        # (K + 1) at start; other widths capture on first use, their timings net of it.
        self.runner.capture_graphs((1, cfg.k + 1))
        self.builder = CacheBuilder(cfg, self.runner, self.bm, self.vocab_size)
        if self.builder.planned:
            self.builder.calibrate()
        self.grammars = draft_grammars(Path(cfg.draft_dir), model.config)
        self.seqs: dict[int, DraftSeq] = {}
        self.pending: list[DraftSeq] = []  # the last reply's sequences, whose cache comes next
        self.shadow = ShadowTally(cfg.k)

    def handle(self, req: P.RoundRequest) -> P.RoundReply:
        """Apply the request's outcomes and answer every sequence: its cached branch on a hit,
        a backup on a miss or for a new sequence."""
        start = time.perf_counter()
        self._drop(req.dropped)
        self.builder.observe_request(req)
        order = [self._apply(u) for u in req.updates]
        specs = {seq.seq_id: spec for seq, spec in order}
        misses = [seq for seq, spec in order if not spec.hit]
        clock = ForwardClock(self.runner)
        neural = self._backup(misses, req.backup, specs) if misses else 0
        clock.stop()
        backup_s = clock.seconds()
        if misses and neural == len(misses):
            self.builder.observe_backup(backup_s)
        self.pending = [seq for seq, _ in order]
        if not self.cfg.lane:
            # Sent from host memory: a GPU tensor in the pickle would be recreated on this
            # worker's GPU inside the target's process.
            for spec in specs.values():
                spec.q = spec.q.to("cpu") if spec.q is not None else None
        b = self.builder
        b.replied(list(specs.values()))
        return P.RoundReply(
            specs=[specs[s.seq_id] for s, _ in order],
            fanout=list(b.fanout(b.depth)),
            budget=b.budget,
            depth=b.depth,
            handle_s=time.perf_counter() - start,
            build_s=b.build_s,
            glue_s=b.glue_s,
            branch_s=b.branch_s,
            backup_s=backup_s,
            cut=b.cut,
            plan=b.plan_figures,
        )

    def _drop(self, seq_ids: list[int]) -> None:
        for sid in seq_ids:
            seq = self.seqs.pop(sid, None)
            if seq is not None:
                self.bm.free_all(seq)

    def _register(self, u: P.SeqUpdate) -> DraftSeq:
        params = u.params or SamplingParams(temperature=0)
        seq = DraftSeq(u.seq_id, list(u.new_tokens), params, u.seed, u.coupled)
        seq.processors, seq.num_prompt = self._processors(u, params), u.num_prompt
        self.seqs[u.seq_id] = seq
        return seq

    def _apply(self, u: P.SeqUpdate) -> tuple[DraftSeq, P.SeqSpec]:
        """A sequence's update: a new sequence is registered (nothing prepared for it yet);
        a known one commits its new tokens and gets the branch cached for that outcome, its
        speculation from now on, or a miss (no tokens: a backup fills them)."""
        if u.new:
            return self._register(u), P.SeqSpec(u.seq_id, [], None, None, None)
        seq = self.seqs[u.seq_id]
        branch = self.builder.match_outcome(seq, u.new_tokens)
        if branch is None:
            return seq, P.SeqSpec(u.seq_id, [], None, False, None)
        seq.spec = branch[0]
        return seq, P.SeqSpec(u.seq_id, branch[0], branch[1], True, None)

    def take(self, msg: P.Feed) -> None:
        """A step the target ran without asking (protocol FEED): commit its tokens and tally
        the shadow chains they settle."""
        self.pending = []  # the target verified nothing of the last reply's caches
        self._drop(msg.dropped)
        for u in msg.updates:
            if u.new:
                self._register(u)
                continue
            verdict = self.builder.absorb(self.seqs[u.seq_id], u.new_tokens)
            if verdict is not None:
                self.shadow.add(*verdict)

    def draft_shadows(self, stop: Callable[[], bool]) -> None:
        """Until ``stop()`` (the next message is on its way): read the context of sequences far
        behind, then draft a shadow chain, the speculation a miss would get, for each caught-up
        greedy or coupled sequence without one."""
        seqs = list(self.seqs.values())
        if not self.builder.catch_up([s for s in seqs if s.catching_up()], stop) or stop():
            return
        idle = [s for s in seqs if not s.shadow_len and not s.catching_up() and shadows(s)]
        if idle:
            neural_backup(idle, self.runner, self.bm, self.cfg, self.builder.fanout(self.cfg.k))
            for seq in idle:
                seq.shadow_len, seq.shadow_hits = len(seq.spec), 0

    def _processors(self, u: P.SeqUpdate, params: SamplingParams) -> Processors | None:
        """The request's processors, as the target runs them: its grammar compiled over the
        draft's tokenizer (the engine checked it is the target's). A request whose processors
        cannot be built here is drafted without them: any proposal is verified exactly."""
        if not params.has_processors:
            return None
        try:
            grammar = None
            if params.structured is not None and self.grammars is not None:
                grammar = self.grammars.compile(params.structured)
            prompt = u.new_tokens[: u.num_prompt]
            return Processors.build(
                params, prompt, self.vocab_size, u.stop_ids, u.bad_words, grammar
            )
        except ValueError as e:
            log.warning("request %d is drafted without its processors: %s", u.seq_id, e)
            return None

    def _backup(self, misses: list[DraftSeq], kind: str, specs: dict[int, P.SeqSpec]) -> int:
        """Speculate for ``misses`` with the backup ``kind``; a sequence still catching up
        (``DraftSeq.catching_up``) gets the fast one, since the draft would first read the rest
        of its context on the target's time. Returns how many got the neural one."""
        neural = [s for s in misses if kind == "neural" and not s.catching_up()]
        chosen = {s.seq_id for s in neural}
        for seq in misses:
            if seq.seq_id not in chosen:
                fast_backup(seq, self.cfg)
                specs[seq.seq_id].tokens = list(seq.spec)
                specs[seq.seq_id].backup = "fast"
        if not neural:
            return 0
        fanout = self.builder.fanout(self.cfg.k)
        qs = neural_backup(neural, self.runner, self.bm, self.cfg, fanout)
        for seq, q in zip(neural, qs, strict=True):
            spec = specs[seq.seq_id]
            spec.tokens, spec.q, spec.backup = list(seq.spec), q, "neural"
        return len(neural)

    def build_pending(
        self,
        stop: Callable[[], bool] | None = None,
        released: Callable[[], bool] | None = None,
    ) -> None:
        """Build the cache for the sequences of the last reply; while planning online, ``stop``
        is polled before each depth after the first and, once true, ends the build with the
        depths decoded so far. Once ``released()`` holds, the target has released them all,
        and the build is abandoned (CacheBuilder.build)."""
        seqs, self.pending = self.pending, []
        if seqs:
            self.builder.build(seqs, stop if self.builder.planned else None, released)


def serve(channel: Channel) -> None:
    """The worker's loop: HELLO, then ROUND -> SPEC (+ cache build) until SHUTDOWN."""
    kind, cfg = channel.recv(0, timeout_s=HELLO_TIMEOUT_S)
    if kind != P.HELLO:
        raise ChannelError(f"expected HELLO, got message kind {kind}")
    if cfg.lane:  # before anything can fail: the target is opening it too
        channel.open_lane(torch.device(cfg.device))
    try:
        worker = DraftWorker(cfg)
    except Exception as e:
        channel.send(0, P.ERROR, f"draft worker failed to start: {e}")
        raise
    # The target rings once before each request, and only once READY: count from here.
    rounds = channel.rings()
    channel.send(0, P.READY, worker.vocab_size)

    def next_request_sent() -> bool:
        return channel.rings() > rounds

    idle = channel.rings(P.IDLE_BELL)  # the idle bell's count as the build under way began

    def all_released() -> bool:
        return channel.rings(P.IDLE_BELL) > idle

    while True:
        ready = time.perf_counter()
        kind, msg = channel.recv(0, timeout_s=IDLE_TIMEOUT_S)
        if kind == P.SHUTDOWN:
            return
        if kind not in (P.ROUND, P.FEED):
            raise ChannelError(f"unexpected message kind {kind}")
        rounds += 1
        if kind == P.FEED:  # no reply: an error shows as the worker's exit
            worker.take(msg)
            worker.shadow.publish(channel)
            worker.draft_shadows(stop=next_request_sent)
            continue
        try:
            reply = worker.handle(msg)
        except Exception:
            channel.send(0, P.ERROR, traceback.format_exc())
            raise
        # Zero when the request was already waiting: the build overran the target's window.
        reply.idle_s = time.perf_counter() - ready - reply.handle_s
        channel.send(0, P.SPEC, reply)
        # Read after the reply, off the target's critical path: a target that went idle before
        # this read is missed, and the build then runs in full, as it would without the bell.
        idle = channel.rings(P.IDLE_BELL)
        worker.build_pending(stop=next_request_sent, released=all_released)


def _die_with(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM when the parent exits (Linux prctl PR_SET_PDEATHSIG); if the
    parent is already gone, exit now."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the target reaps its worker itself
        return
    if os.getppid() != parent_pid:
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="saguaro draft-worker",
        description="Run an SSD draft worker that joins a target engine's rendezvous.",
    )
    parser.add_argument("--addr", default=os.environ.get("MASTER_ADDR", EngineConfig.draft_addr))
    parser.add_argument("--port", type=int, default=int(os.environ.get("MASTER_PORT", "0")))
    parser.add_argument(
        "--timeout",
        type=float,
        default=EngineConfig.draft_timeout_s,
        help="per-message timeout once joined (s; default: the engine's draft_timeout_s)",
    )
    parser.add_argument(
        "--parent-pid", type=int, help="exit when this process (the target engine) exits (Linux)"
    )
    args = parser.parse_args(argv)
    if not args.port:
        parser.error("--port (or MASTER_PORT) is required")
    if args.parent_pid is not None:
        _die_with(args.parent_pid)
    logging.basicConfig(level=logging.INFO, format="[draft-worker] %(message)s")
    try:
        serve(Channel(1, args.addr, args.port, args.timeout).connect())
    except ChannelError as e:
        log.info("target went away (%s); exiting", e)
        return 1
    return 0


if __name__ == "__main__":
    exit_now(main())
