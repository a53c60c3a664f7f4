"""SSD, target side: proposals come from a draft worker in its own process.

Each round the proposer sends the worker what the target committed since its last message and
receives the next speculation for every sequence at once: from the speculation cache on a hit,
from a backup on a miss (chosen per round by :class:`BackupPolicy` from online estimates). While
the target verifies, the worker prepares the following round. If the worker dies, errors or does
not answer within ``draft_timeout_s``, :class:`DraftWorkerError` is raised; the supervisor
(:mod:`saguaro.speculation.supervisor`) carries on without it, exactly, and restarts it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
import weakref

import torch

from saguaro.config import EngineConfig
from saguaro.core.proposal import Proposal, Proposer
from saguaro.core.sequence import Sequence
from saguaro.distributed.channel import Channel, ChannelError
from saguaro.distributed.processes import SHUTDOWN_GRACE_S, reap
from saguaro.errors import DraftWorkerError
from saguaro.sampling import SparseQ
from saguaro.speculation import protocol as P
from saguaro.speculation.planner import SSDEstimates
from saguaro.speculation.policy import BackupPolicy

log = logging.getLogger("saguaro")

OVERRUN_IDLE_S = 5e-4  # a worker idle for less than this before a request was still busy
# The worker's READY comes after it has imported torch and loaded the draft, which can take
# longer than a round: wait at least this long for it.
STARTUP_TIMEOUT_S = 120.0
# With compile=True the worker also compiles every kind of forward before READY: without
# inductor's disk cache that takes minutes on a few cores, so its start gets this long.
COMPILED_STARTUP_TIMEOUT_S = 1800.0
# The window offered to the worker is capped at this many verifications: an engine idle between
# requests is not time the worker can plan a build on.
WINDOW_CAP_VERIFICATIONS = 3
EXIT_CODE_WAIT_S = 1.0  # a dead worker closes its socket before it is reaped: wait this long
REPLY_TIMES = ("glue_s", "branch_s", "build_s", "backup_s", "handle_s")  # summed per round


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class SSDProposer(Proposer):
    def __init__(
        self, cfg: EngineConfig, draft_dir: str, max_model_len: int, vocab_size: int
    ) -> None:
        self.cfg = cfg
        self.k = cfg.num_speculative_tokens
        self.vocab_size = vocab_size
        self.timeout_s = cfg.draft_timeout_s
        self.policy = BackupPolicy(mode=cfg.backup, K=self.k)
        self.known: dict[int, int] = {}  # seq_id -> tokens the worker has been sent
        self.dropped: list[int] = []
        self.verify_s: float | None = None
        self.last_wait_s: float | None = None
        self.replied_at: float | None = None
        self.last_reply: P.RoundReply | None = None
        # After a pause the next round's outcomes were never predicted (the worker did not see
        # the rounds in between): they are misses that say nothing about the cache.
        self.resuming = False
        # Cumulative per-round draft-side seconds and counts (callers diff two snapshots); round_s
        # is the wall time from one request to the next while sequences are in flight.
        self.totals = dict.fromkeys(
            ("rounds", *REPLY_TIMES, "overran", "cut", "timed_rounds", "round_s"), 0.0
        )
        self.round_started: float | None = None
        self.shadow_seen = ([0] * self.k, [0] * self.k)  # the shadow bells' last counts
        self.proc: subprocess.Popen | None = None
        self.closed = False
        self.channel = Channel(0, cfg.draft_addr, cfg.draft_port, self.timeout_s)
        if cfg.draft_worker == "spawn":
            self._spawn()
        else:
            log.info(
                "waiting for an external draft worker on %s:%d", cfg.draft_addr, self.channel.port
            )
        self._handshake(draft_dir, max_model_len)

    def _spawn(self) -> None:
        """Start the draft worker as a child process on the channel's port."""
        cfg = self.cfg
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "saguaro.speculation.worker",
                "--addr",
                cfg.draft_addr,
                "--port",
                str(self.channel.port),
                "--timeout",
                str(self.timeout_s),
                # Tie the worker's life to this process (never an orphan), but only when the
                # main thread spawns it: the kernel signals a child when the *thread* that
                # started it exits.
                *(["--parent-pid", str(os.getpid())] if _on_main_thread() else []),
            ],
            env={**os.environ, "OMP_NUM_THREADS": str(cfg.draft_threads or 1)},
        )
        self._finalizer = weakref.finalize(self, reap, self.proc)
        atexit.register(self._finalizer)

    def _handshake(self, draft_dir: str, max_model_len: int) -> None:
        """Connect, send the worker its configuration and wait for it to be ready."""
        cfg = self.cfg
        try:
            self.channel.connect()
            hello = P.WorkerConfig.from_engine(cfg, draft_dir, max_model_len)
            self.channel.send(1, P.HELLO, hello)
            if hello.lane:
                self.channel.open_lane(torch.device(cfg.device))
            startup_s = COMPILED_STARTUP_TIMEOUT_S if cfg.compile else STARTUP_TIMEOUT_S
            kind, msg = self.channel.recv(1, timeout_s=max(self.timeout_s, startup_s))
        except ChannelError as e:
            self.close()
            raise DraftWorkerError(f"draft worker did not start: {e}") from e
        if kind != P.READY:
            self.close()
            raise DraftWorkerError(f"draft worker did not start: {msg}")

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        updates = [self._update(s) for s in seqs]
        backup = self.policy.choose(len(seqs))
        t0 = time.perf_counter()
        self._time_round(t0)
        window = None
        if self.replied_at is not None and self.verify_s:
            window = min(t0 - self.replied_at, WINDOW_CAP_VERIFICATIONS * self.verify_s)
        request = P.RoundRequest(updates, self.dropped, backup, self.verify_s, window)
        self.dropped = []
        reply = self._ask(request)
        self.replied_at = time.perf_counter()
        wait_s = self.last_wait_s = self.replied_at - t0
        self._tally(reply)
        if reply.backup_s:
            self.policy.observe_times(self.verify_s or wait_s, backup_s={backup: reply.backup_s})
        return self._proposal(reply, ks, wait_s)

    def feed(self, seqs: list[Sequence]) -> None:
        """Send what ``seqs`` committed since the worker last heard, for a step run without it
        (protocol FEED; no reply): it stays current and drafts shadow chains meanwhile."""
        feed = P.Feed([self._update(s) for s in seqs], self.dropped)
        self.dropped = []
        self._send(P.FEED, feed)

    def shadow_counts(self) -> tuple[list[int], list[int]]:
        """Per position j, the worker's shadow chains that reached it and that had its token
        committed, since the last call (protocol FEED). Every settled chain tried its first
        position, so the others are read only when that count moved: one store request a step
        while nothing settles."""
        try:
            first = self.channel.rings(P.shadow_bell("tried", 0))
            if first == self.shadow_seen[0][0]:
                return [0] * self.k, [0] * self.k
            now = [
                [self.channel.rings(P.shadow_bell(kind, j)) for j in range(self.k)]
                for kind in ("tried", "hits")
            ]
        except ChannelError as e:
            raise DraftWorkerError(self._why(e)) from e
        tried = [a - b for a, b in zip(now[0], self.shadow_seen[0], strict=True)]
        hits = [a - b for a, b in zip(now[1], self.shadow_seen[1], strict=True)]
        self.shadow_seen = (now[0], now[1])
        return tried, hits

    def _update(self, s: Sequence) -> P.SeqUpdate:
        """What the worker must learn of ``s``: all of it the first time, else its new tokens."""
        sent = self.known.get(s.seq_id)
        self.known[s.seq_id] = len(s)
        if sent is not None:
            return P.SeqUpdate(s.seq_id, s.token_ids[sent:])
        proc = s.processors
        return P.SeqUpdate(
            s.seq_id,
            list(s.token_ids),
            s.params,
            s.num_prompt_tokens,
            list(proc.stop_ids) if proc is not None else [],
            list(proc.bad_words) if proc is not None else [],
            s.seed,
            coupled=s.params.method(self.cfg.sampling) == "coupled",
            new=True,
        )

    def _time_round(self, t0: float) -> None:
        """Close the last round's clock at ``t0``: its length, and the target's own time in it
        beyond its forward and its wait, for the backup policy."""
        if self.round_started is not None:
            round_s = t0 - self.round_started
            self.totals["timed_rounds"] += 1
            self.totals["round_s"] += round_s
            if self.verify_s and self.last_wait_s is not None:
                other_s = round_s - self.verify_s - self.last_wait_s
                self.policy.observe_times(self.verify_s, other_s=other_s)
        self.round_started = t0

    def _send(self, kind: int, msg: object) -> None:
        """Ring, then send: a build or shadow chain under way stops at its next forward."""
        try:
            self.channel.ring()
            self.channel.send(1, kind, msg)
        except ChannelError as e:
            raise DraftWorkerError(self._why(e)) from e

    def _ask(self, request: P.RoundRequest) -> P.RoundReply:
        self._send(P.ROUND, request)
        try:
            kind, reply = self.channel.recv(1, timeout_s=self.timeout_s)
        except ChannelError as e:
            raise DraftWorkerError(self._why(e)) from e
        if kind != P.SPEC:
            raise DraftWorkerError(f"draft worker failed:\n{reply}")
        return reply

    def _tally(self, reply: P.RoundReply) -> None:
        self.last_reply = reply
        self.totals["rounds"] += 1
        for name in REPLY_TIMES:
            self.totals[name] += getattr(reply, name)
        # The request found the worker still building: the build overran the target's window.
        self.totals["overran"] += reply.idle_s < OVERRUN_IDLE_S
        self.totals["cut"] += reply.cut

    def _proposal(self, reply: P.RoundReply, ks: list[int], wait_s: float) -> Proposal:
        """The reply's speculations cut to each sequence's k, as one batch. Lists are made
        tensors once: a tensor operator per sequence would cost more than the copying it does."""
        counts = [min(len(spec.tokens), k) for spec, k in zip(reply.specs, ks, strict=True)]
        pairs = zip(reply.specs, counts, strict=True)
        rows = [spec.tokens[:m] + [0] * (self.k - m) for spec, m in pairs]
        tokens = torch.tensor(rows, dtype=torch.int64)
        num_draft = torch.tensor(counts, dtype=torch.int64)
        sampled = [(i, spec.q) for i, spec in enumerate(reply.specs) if spec.q is not None]
        q = None
        if sampled:  # point masses (greedy, n-gram) for the rest, where the replies' q are
            width, device = max(sq.width for _, sq in sampled), sampled[0][1].ids.device
            q = SparseQ.point_mass(tokens, width).to(device)
            for i, sq in sampled:
                m, padded = counts[i], sq.pad_to(q.width)
                q.ids[i, :m], q.probs[i, :m] = padded.ids[:m], padded.probs[:m]
        return Proposal(
            tokens,
            num_draft,
            q=q,
            hit=[s.hit for s in reply.specs],
            backup=[s.backup for s in reply.specs],
            wait_s=wait_s,
            mode="ssd",
        )

    def observe(self, seqs: list[Sequence], target_s: float, positions: int) -> None:
        """Feed the backup policy with this round's outcomes and the verification time."""
        self.verify_s = target_s
        for s in seqs:
            r = s.records[-1]
            if r.hit is not None and not self.resuming:
                self.policy.observe_round(r.hit, r.num_accepted + 1, r.backup)
        self.resuming = False
        if self.last_reply is not None:
            self.policy.observe_times(target_s, primary_s=self.last_reply.build_s)

    def unsent(self, seq: Sequence) -> int:
        """Tokens of ``seq`` the worker has not been sent: what it catches up on next."""
        return len(seq) - self.known.get(seq.seq_id, 0)

    def release(self, seq: Sequence) -> None:
        if self.known.pop(seq.seq_id, None) is not None:
            self.dropped.append(seq.seq_id)
            if not self.known:  # the worker may stop building caches nobody will read
                self._ring_idle()
        if not self.known:  # idle until the next request: not part of any round or window
            self.pause()

    def _ring_idle(self) -> None:
        # A bell that does not ring only costs the worker a build: not worth failing a request
        # for (the next round's own use of the channel reports a broken one).
        with contextlib.suppress(ChannelError):
            self.channel.ring(P.IDLE_BELL)

    def pause(self) -> None:
        # Time until the next request is not one round of ours, nor a window to build in.
        self.round_started = self.replied_at = self.last_wait_s = None
        self.resuming = True

    def estimates(self, batch: int) -> SSDEstimates:
        """The policy's figures for a batch of ``batch``, misses served by the backup it would
        choose (docs/design.md §7, §12)."""
        kind = self.policy.choose(batch)
        p = self.policy
        return SSDEstimates(p.p_hit, p.e_hit, p.e_miss[kind], p.t_p, p.t_b[kind], kind)

    def stats(self, batch: int) -> dict:
        """Fan-out, budget, cache-build timings (the last round's, and cumulative ``totals``),
        policy estimates, and the docs/design.md §7 speedup predicted from them for a batch of
        ``batch`` sequences (relative to one verification, as §7 states it)."""
        kind = self.policy.choose(batch)
        out = {
            "policy": self.policy.snapshot(),
            "backup_choice": kind,
            "predicted_speedup": self.policy.predicted(batch, kind),
            "totals": dict(self.totals),
        }
        if self.last_reply is not None:
            r = self.last_reply
            out.update(
                fanout=r.fanout,
                budget=r.budget,
                depth=r.depth,
                build_s=r.build_s,
                glue_s=r.glue_s,
                branch_s=r.branch_s,
                plan=r.plan,
            )
        return out

    def exit_code(self) -> int | None:
        """The spawned worker's exit code once it has exited, else None (an external worker's
        death shows at its next round)."""
        return None if self.proc is None else self.proc.poll()

    def _why(self, err: Exception) -> str:
        if self.proc is not None:
            try:  # a dead worker closes its socket first; give it a moment to be reaped
                return f"draft worker exited with code {self.proc.wait(timeout=EXIT_CODE_WAIT_S)}"
            except subprocess.TimeoutExpired:
                pass
        # The channel's message wraps the transport's; its first line says what failed (further
        # lines, if any, are the transport's hints and traces).
        lines = str(err).strip().splitlines()
        detail = lines[0] if lines else type(err).__name__
        return f"draft worker stopped answering (timeout {self.timeout_s:g}s: {detail})"

    def close(self, failed: bool = False) -> None:
        """Shut the worker down; after a failure, do not wait for it to cooperate."""
        if self.closed:
            return
        self.closed = True
        alive = self.proc is None or self.proc.poll() is None  # external: assume alive
        if alive and not failed and self.channel.pg is not None:
            try:
                self.channel.send(1, P.SHUTDOWN, None)
                if self.proc is not None:
                    self.proc.wait(timeout=SHUTDOWN_GRACE_S)
            except (ChannelError, subprocess.TimeoutExpired):
                pass
        if failed and self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        reap(self.proc)
        self.channel.close()
