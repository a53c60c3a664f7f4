"""The SSD draft worker: one loop over the protocol in :mod:`saguaro.speculation.protocol`.

Per round it (1) reads each sequence's outcome ``(k, t)`` from the tokens the target committed,
(2) answers with the cached speculation on a hit, or with a backup on a miss, and then, while
the target verifies what it just received, (3) builds the speculation cache for that round:

- glue pass: one forward over ``[r, s_1..s_K]`` (plus any committed tokens the draft has not
  seen) writes the draft KV of the path that may be accepted and gives the draft's logits at
  every position 1..K+1;
- candidates: for outcome k < K, the top ``F_k`` draft tokens at position k+1 with ``s_{k+1}``
  excluded (a rejected token is never the recovery token); for k = K, the top ``F_K`` at K+1;
- branch decoding: every branch ``(k, t)`` extends ``prefix + s_1..s_k + t`` by K sampled
  tokens. All branches of all sequences decode together, one forward per depth. A branch sees
  the committed prefix, the glue tokens up to its fork point and its own earlier tokens, through
  a per-sequence mask; its KV goes to scratch slots past the glue while its RoPE positions
  continue its own path. Scratch is overwritten by the next glue pass.

While the build is planned online, it is cut short when the target's next request is already on
its way (the channel's doorbell, checked before each depth after the first): branches keep the
depths decoded so far. A late cache would stall the target for the rest of the build; a shallower
one costs only tokens on a hit. An empty one would turn every outcome into a miss, so the first
depth always runs. A fan-out or budget fixed by the user is built in full.

Exactness of a hit: the branch for ``(k, t)`` was sampled, with its q rows recorded, given exactly
the prefix that the outcome commits; whether it is used depends only on the target's own
randomness. Every draft token, on a branch or in a backup, is drawn from the draft's top-M
distribution with the request's draft noise at that token's absolute position, so a hit
proposes what a backup would have. Saguaro sampling lowers q on the draft's top
``F_{i-1} + 1`` tokens at speculation position i; the target verifies against that same q.
Under coupled sampling every draft token is the perturbed argmax of the draft's distribution
under the target's own noise at its position, and outcome k's candidates are ranked by the
same perturbed values (excluding s_{k+1}): speculation at T > 0 then works like greedy
speculation on perturbed logits, and nothing about q is shipped.
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

import torch

from saguaro.core.query import Query, token_slots
from saguaro.distributed.channel import Channel, ChannelError
from saguaro.engine.block_manager import BlockManager
from saguaro.engine.model_runner import ModelRunner
from saguaro.models.loader import load_model
from saguaro.sampling import SamplingParams, SamplingTensors, SparseQ, propose, seed_tensor
from saguaro.sampling.coupled import propose_coupled, ranked_proposals
from saguaro.speculation import protocol as P
from saguaro.speculation.fanout import FanoutEstimator
from saguaro.speculation.ngram import prompt_lookup
from saguaro.speculation.planner import BuildCosts, plan_build
from saguaro.speculation.sd import Chain, decode_chains, propose_rows

log = logging.getLogger("saguaro.worker")

MAX_BUDGET = 64  # branches per sequence the KV pool is sized for
MAX_RANK = 64  # candidates ranked per position for the fan-out statistics
FIT = 0.9  # plan the cache build against this fraction of the target's window


@dataclass(eq=False)
class DraftSeq:
    seq_id: int
    token_ids: list[int]
    params: SamplingParams
    seed: int
    coupled: bool  # this request's method: coupled sampling, or rejection sampling
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    computed: int = 0  # committed tokens with valid draft KV
    written: int = 0  # draft KV written for indices < written by the last glue / backup
    spec: list[int] = field(default_factory=list)  # speculation the target is verifying
    cache: dict[tuple[int, int], tuple[list[int], SparseQ | None]] = field(default_factory=dict)
    ranked: list[list[int]] = field(default_factory=list)  # per outcome k: candidate ranking


class DraftWorker:
    def __init__(self, cfg: P.WorkerConfig) -> None:
        self.cfg = cfg
        if cfg.cpus:
            os.sched_setaffinity(0, cfg.cpus)
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        model = load_model(cfg.draft_dir, cfg.dtype, cfg.device)
        self.k = cfg.k
        self.vocab_size = model.config.vocab_size
        per_seq = -(-(cfg.max_model_len + (MAX_BUDGET + 2) * cfg.k) // cfg.block_size)
        num_blocks = per_seq * cfg.max_num_seqs
        self.bm = BlockManager(num_blocks, cfg.block_size, enable_prefix_caching=False)
        self.runner = ModelRunner(model, num_blocks, cfg.block_size, cfg.device)
        self.seqs: dict[int, DraftSeq] = {}
        self.estimator = FanoutEstimator(cfg.k, max_rank=MAX_RANK)
        self.fixed = cfg.fanout if isinstance(cfg.fanout, list) else None
        # B and d are planned online (planner.py) unless the user fixed the fan-out or budget.
        self.planned = self.fixed is None and cfg.budget is None
        if self.fixed is not None:
            self.budget = sum(self.fixed)
        else:
            self.budget = 8 if cfg.budget is None else cfg.budget
        self.depth = self.k
        self.costs = BuildCosts()
        self._fanouts: dict[int, list[int]] = {}
        self.glue_s = self.branch_s = self.build_s = 0.0
        self.cut = False  # the last build stopped before its planned depth
        self.backup_kind = "neural"  # the target's choice for the last round's misses
        self.verify_s: float | None = None  # the target's last verification forward
        self.pending: list[DraftSeq] = []

    # ---- fan-out ----------------------------------------------------------------------------

    def fanout(self, m: int) -> list[int]:
        """F_0..F_m for a round speculating m tokens, at the current budget (memoised per plan).
        A fixed fan-out F_0..F_K serves shorter rounds with its bonus entry F_K last."""
        if m not in self._fanouts:
            if self.fixed is not None:
                self._fanouts[m] = self.fixed[:m] + [self.fixed[self.k]]
            else:
                mode = "geometric" if self.cfg.fanout == "geometric" else "empirical"
                cap = self.vocab_size - 2
                self._fanouts[m] = self.estimator.allocate(self.budget, m, mode, cap=cap)
        return self._fanouts[m]

    def _plan(self, num_seqs: int) -> None:
        """Choose B and d for the next build from the online costs and statistics."""
        window = self.costs.window.value or self.verify_s
        fixed = self.costs.fixed.value
        depth_s = self.costs.depth_s
        if not self.planned or not window or fixed is None or depth_s(1) is None:
            return
        backup_s = 0.0
        miss_tokens = 1.0  # a fast backup: the round commits the target's token, rarely more
        if self.backup_kind == "neural":
            backup_s = self.costs.backup.value or self.k * depth_s(num_seqs)
            miss_tokens = self.estimator.expected_tokens(self.k)
        plan = plan_build(
            window_s=FIT * window,
            fixed_s=fixed,
            depth_s=depth_s,
            hit_rates=self.estimator.hit_rates(MAX_BUDGET, self.depth, cap=self.vocab_size - 2),
            expected_tokens=[self.estimator.expected_tokens(d) for d in range(self.k + 1)],
            miss_tokens=miss_tokens,
            backup_s=backup_s,
            num_seqs=num_seqs,
            max_budget=MAX_BUDGET,
        )
        if (plan.budget, plan.depth) != (self.budget, self.depth):
            self.budget, self.depth = plan.budget, plan.depth
            self._fanouts = {}

    # ---- one round --------------------------------------------------------------------------

    def handle(self, req: P.RoundRequest) -> P.RoundReply:
        start = time.perf_counter()
        for sid in req.dropped:
            seq = self.seqs.pop(sid, None)
            if seq is not None:
                self.bm.free_all(seq)
        if req.window_s:
            self.costs.window.update(req.window_s)
        self.backup_kind, self.verify_s = req.backup, req.verify_s
        specs: dict[int, P.SeqSpec] = {}
        misses: list[DraftSeq] = []
        order: list[DraftSeq] = []
        for u in req.updates:
            if u.new:
                params = SamplingParams(temperature=u.temperature, top_k=u.top_k, top_p=u.top_p)
                seq = DraftSeq(u.seq_id, list(u.new_tokens), params, u.seed, u.coupled)
                self.seqs[u.seq_id] = seq
                specs[u.seq_id] = P.SeqSpec(u.seq_id, [], None, None, None)
                misses.append(seq)
            else:
                seq = self.seqs[u.seq_id]
                k, t = len(u.new_tokens) - 1, u.new_tokens[-1]
                # An outcome of the speculation commits s_1..s_k, t. Anything else (the target
                # also ran rounds without asking us) can only be a miss: a branch is used only
                # for the exact prefix it was sampled under.
                matched = _common_prefix(u.new_tokens, seq.spec)
                outcome = k <= len(seq.spec) and matched >= k
                if outcome and seq.ranked:  # ranked[k] ranks the candidates for outcome k
                    ranking = seq.ranked[k]
                    rank = ranking.index(t) if t in ranking else None
                    self.estimator.observe(k, rank, K=len(seq.spec))
                branch = seq.cache.get((k, t)) if outcome else None
                old_len = len(seq.token_ids)
                seq.token_ids.extend(u.new_tokens)
                # glue KV is valid for r and the accepted speculation only
                seq.computed = min(seq.written, old_len + matched, len(seq.token_ids) - 1)
                seq.cache, seq.ranked = {}, []
                self.bm.trim(seq, len(seq.token_ids))
                if branch is not None:
                    seq.spec = branch[0]
                    specs[u.seq_id] = P.SeqSpec(u.seq_id, branch[0], branch[1], True, None)
                else:
                    specs[u.seq_id] = P.SeqSpec(u.seq_id, [], None, False, None)
                    misses.append(seq)
            order.append(seq)
        t0 = time.perf_counter()
        if misses:
            self._backup(misses, req.backup, specs)
        backup_s = time.perf_counter() - t0
        if misses and req.backup == "neural":
            self.costs.backup.update(backup_s)
        self.pending = order
        return P.RoundReply(
            specs=[specs[s.seq_id] for s in order],
            fanout=list(self.fanout(self.depth)),
            budget=self.budget,
            depth=self.depth,
            handle_s=time.perf_counter() - start,
            build_s=self.build_s,
            glue_s=self.glue_s,
            branch_s=self.branch_s,
            backup_s=backup_s,
            cut=self.cut,
        )

    def _backup(self, misses: list[DraftSeq], kind: str, specs: dict[int, P.SeqSpec]) -> None:
        if kind == "fast":
            for seq in misses:
                seq.spec = prompt_lookup(seq.token_ids, self._room(seq))
                specs[seq.seq_id].tokens = list(seq.spec)
                specs[seq.seq_id].backup = "fast"
            return
        ks = [self._room(seq) for seq in misses]
        for seq, k in zip(misses, ks, strict=True):
            self.bm.allocate(seq, len(seq.token_ids) + k)
        chains = [
            Chain(s.block_table, s.token_ids, s.computed, k, s.params, s.seed, s.coupled)
            for s, k in zip(misses, ks, strict=True)
        ]
        tokens, q = decode_chains(self.runner, chains, self._propose_fn(misses))
        for i, (seq, k) in enumerate(zip(misses, ks, strict=True)):
            seq.spec = tokens[i, :k].tolist()
            if k:  # KV written up to the last proposal, which is never fed
                seq.written = len(seq.token_ids) + k - 1
                seq.computed = min(seq.written, len(seq.token_ids) - 1)
            spec = specs[seq.seq_id]
            spec.tokens = list(seq.spec)
            spec.q = None if q is None or seq.params.greedy else q[i, :k].clone()
            spec.backup = "neural"

    def _room(self, seq: DraftSeq) -> int:
        """Proposals that still fit in the context after the sequence's committed tokens."""
        return max(0, min(self.k, self.cfg.max_model_len - len(seq.token_ids)))

    def _propose_fn(self, seqs: list[DraftSeq]):
        """Saguaro sampling: speculation position i = depth + 1 uses F = F_{i-1} = F_depth."""
        fanout = self.fanout(self.k)

        def fn(logits: torch.Tensor, rows: list[int], depth: int, positions: torch.Tensor):
            st = SamplingTensors.from_params([seqs[i].params for i in rows])
            seeds = seed_tensor([seqs[i].seed for i in rows])
            coupled = [seqs[i].coupled for i in rows]
            return propose_rows(
                logits,
                st,
                seeds,
                positions,
                self.cfg.top_m,
                coupled,
                fanout[depth],
                self.cfg.saguaro_c,
            )

        return fn

    # ---- cache build (overlaps the target's verification) ------------------------------------

    def build_pending(self, stop: Callable[[], bool] | None = None) -> None:
        """Build the cache for the sequences of the last reply; while planning online, ``stop``
        is polled before each depth after the first and, once true, ends the build with the
        depths decoded so far."""
        seqs, self.pending = self.pending, []
        if seqs:
            self.build(seqs, stop if self.planned else None)

    def build(self, seqs: list[DraftSeq], stop: Callable[[], bool] | None = None) -> None:
        t0 = time.perf_counter()
        self._plan(len(seqs))
        k_spec = self.k
        # 1. glue pass
        queries = []
        for seq in seqs:
            n = len(seq.token_ids)
            self.bm.allocate(seq, n + k_spec)
            # No position past the context: the target cannot commit tokens there anyway.
            seq.spec = seq.spec[: self._room(seq)]
            feed = seq.token_ids[seq.computed :] + seq.spec
            queries.append(
                self.runner.sequence_query(seq.block_table, seq.computed, feed, len(seq.spec) + 1)
            )
            seq.written = n + len(seq.spec)
        glue_logits = self.runner.forward(queries)
        t1 = time.perf_counter()
        # 2. candidates per outcome
        branches: list[list[tuple[int, int]]] = []
        offset = 0
        for seq in seqs:
            m = len(seq.spec) + 1
            rows = glue_logits[offset : offset + m]
            offset += m
            width = min(MAX_RANK + 1, self.vocab_size)
            if seq.coupled and not seq.params.greedy:
                # outcome k's token is the target's perturbed argmax at position n + k: rank
                # the draft's candidates under the same noise
                st = SamplingTensors.from_params([seq.params] * m)
                positions = len(seq.token_ids) + torch.arange(m)
                seeds = seed_tensor([seq.seed] * m)
                top = ranked_proposals(rows, st, seeds, positions, width)[:, :width].tolist()
            else:
                top = torch.topk(rows, width, dim=-1).indices.tolist()
            fanout = self.fanout(m - 1)
            seq.ranked, seq_branches = [], []
            for k in range(m):
                excluded = seq.spec[k] if k < len(seq.spec) else None
                ranking = [t for t in top[k] if t != excluded][:MAX_RANK]
                seq.ranked.append(ranking)
                seq_branches.extend((k, t) for t in ranking[: fanout[k]])
            # A branch forked after the whole speculation decodes up to position
            # n + len(spec) + depth - 1: near the end of the context, build nothing (every
            # outcome then misses and the backup speculates what still fits).
            if len(seq.token_ids) + len(seq.spec) + self.depth > self.cfg.max_model_len:
                seq_branches = []
            branches.append(seq_branches)
        # 3. branch decoding
        depths_s = self._decode_branches(seqs, branches, stop)
        t2 = time.perf_counter()
        self.glue_s, self.branch_s, self.build_s = t1 - t0, t2 - t1, t2 - t0
        self.costs.fixed.update(self.build_s - depths_s)

    def _decode_branches(
        self,
        seqs: list[DraftSeq],
        branches: list[list[tuple[int, int]]],
        stop: Callable[[], bool] | None = None,
    ) -> float:
        """Decode every branch for d = ``self.depth`` tokens (at least 1 once ``stop()``); scratch
        starts after the longest possible glue (K + 1 positions), each branch owning d slots.
        Returns the seconds spent in the depth steps.

        Cutting is exact: a branch's first j tokens are sampled exactly as a j-token branch's
        would be, and where the cut falls depends only on the target's timing."""
        k, fanout = self.depth, self.fanout(self.depth)
        self.cut = False
        live = [i for i, b in enumerate(branches) if b]
        if not live:
            return 0.0
        bs = self.cfg.block_size
        layout = {}  # seq index -> (base index of scratch, key slots, static mask part)
        for i in live:
            seq, nb = seqs[i], len(branches[i])
            n = len(seq.token_ids)
            base = n + self.k
            self.bm.allocate(seq, base + nb * k)
            keys = token_slots(seq.block_table, 0, base + nb * k, bs)
            glue_len = len(seq.spec)
            mask = torch.zeros(nb, base + nb * k, dtype=torch.bool)
            mask[:, :n] = True
            fork = torch.tensor([kk for kk, _ in branches[i]])
            mask[:, n : n + glue_len] = torch.arange(glue_len).unsqueeze(0) < fork.unsqueeze(1)
            layout[i] = (base, keys, mask, fork)
        tokens = {i: torch.tensor([t for _, t in branches[i]]) for i in live}
        out_tokens = {i: torch.zeros(len(branches[i]), k, dtype=torch.int64) for i in live}
        # greedy branches are point masses: their argmax is all a hit needs
        out_q = {
            i: SparseQ.point_mass(out_tokens[i], min(self.cfg.top_m, self.vocab_size))
            for i in live
            if not seqs[i].params.greedy and not seqs[i].coupled
        }
        num_branches = sum(len(branches[i]) for i in live)
        depths_s, done = 0.0, k
        for depth in range(k):
            if depth and stop is not None and stop():
                self.cut, done = True, depth
                break
            t0 = time.perf_counter()
            queries = []
            for i in live:
                seq = seqs[i]
                base, keys, mask, fork = layout[i]
                nb = len(branches[i])
                n = len(seq.token_ids)
                own = base + torch.arange(nb) * k + depth  # scratch index of this depth
                mask[torch.arange(nb), own] = True
                queries.append(
                    Query(
                        token_ids=tokens[i].tolist(),
                        positions=n + fork + depth,
                        slots=keys[own],
                        key_slots=keys,
                        num_logits=nb,
                        mask=mask,  # copied into the batch mask before the next depth edits it
                    )
                )
            logits = self.runner.forward(queries)
            offset = 0
            for i in live:
                seq, nb = seqs[i], len(branches[i])
                rows = logits[offset : offset + nb]
                offset += nb
                if seq.params.greedy:
                    drawn = rows.argmax(dim=-1)
                else:
                    # the token drawn here lands right after the branch's input token
                    positions = len(seq.token_ids) + layout[i][3] + depth + 1
                    st = SamplingTensors.from_params([seq.params] * nb)
                    seeds = seed_tensor([seq.seed] * nb)
                    if seq.coupled:
                        drawn, _ = propose_coupled(rows, st, seeds, positions, self.cfg.top_m)
                    else:
                        drawn, q = propose(
                            rows,
                            st,
                            seeds,
                            positions,
                            self.cfg.top_m,
                            fanout[depth],
                            self.cfg.saguaro_c,
                        )
                        out_q[i].ids[:, depth], out_q[i].probs[:, depth] = q.ids, q.probs
                out_tokens[i][:, depth] = drawn
                tokens[i] = drawn
            seconds = time.perf_counter() - t0
            depths_s += seconds
            self.costs.observe_depth(num_branches, seconds)
        for i in live:
            seq, q = seqs[i], out_q.get(i)
            for j, key in enumerate(branches[i]):
                seq.cache[key] = (
                    out_tokens[i][j, :done].tolist(),
                    None if q is None else q[j, :done].clone(),
                )
        return depths_s


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def serve(channel: Channel) -> None:
    """The worker's loop: HELLO, then ROUND -> SPEC (+ cache build) until SHUTDOWN."""
    kind, cfg = channel.recv(0, timeout_s=600)
    if kind != P.HELLO:
        raise ChannelError(f"expected HELLO, got message kind {kind}")
    try:
        worker = DraftWorker(cfg)
    except Exception as e:
        channel.send(0, P.ERROR, f"draft worker failed to start: {e}")
        raise
    # The target rings once before each request, and only once READY: count from here.
    rounds = channel.rings()
    channel.send(0, P.READY, worker.vocab_size)
    idle_timeout = 7 * 24 * 3600.0  # the target may idle for long; its death closes the socket

    def next_request_sent() -> bool:
        return channel.rings() > rounds

    while True:
        ready = time.perf_counter()
        kind, msg = channel.recv(0, timeout_s=idle_timeout)
        if kind == P.SHUTDOWN:
            return
        if kind != P.ROUND:
            raise ChannelError(f"unexpected message kind {kind}")
        rounds += 1
        try:
            reply = worker.handle(msg)
        except Exception:
            channel.send(0, P.ERROR, traceback.format_exc())
            raise
        # Zero when the request was already waiting: the build overran the target's window.
        reply.idle_s = time.perf_counter() - ready - reply.handle_s
        channel.send(0, P.SPEC, reply)
        worker.build_pending(stop=next_request_sent)


def _die_with(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM when the parent exits (Linux prctl PR_SET_PDEATHSIG); if the
    parent is already gone, exit now."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the target reaps its worker itself
        return
    if os.getppid() != parent_pid:
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="saguaro draft-worker",
        description="Run an SSD draft worker that joins a target engine's rendezvous.",
    )
    parser.add_argument("--addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("MASTER_PORT", "0")))
    parser.add_argument("--timeout", type=float, default=60.0, help="rendezvous timeout (s)")
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
    sys.exit(main())
