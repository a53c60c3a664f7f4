"""Paged KV blocks with prefix caching.

Every sequence owns a block table: block ``i`` holds the KV of token indices
``[i * block_size, (i + 1) * block_size)``. All model runners of one engine (target and in-process
draft) index their own KV pools with the same table.

Prefix caching: once every token of a full block has valid KV in the target's pool, the block
gets the hash ``h_i = hash((h_{i-1}, tokens_i))``, a chain over the whole prefix. A new sequence
whose leading full blocks have the same chain (and, checked, the same tokens) shares those
blocks and skips computing them. An in-process draft's KV may lag behind the target's (mode
auto running AR computes none), so a block also records whether the draft's KV is in it: a
sequence admitted onto cached blocks learns how many leading ones hold it, and its draft
computes the rest itself. Registration therefore never waits for the draft. Freed blocks keep
their hash until the pool hands them out again (least recently freed first), so a finished or
preempted request's prefix stays reusable.

Only committed tokens are ever hashed, so rolling back speculative slots never touches a hashed
block.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from saguaro.core.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = field(default=())
    draft_kv: bool = False  # the in-process draft's KV for all its tokens is in its pool


class NoFreeBlocksError(RuntimeError):
    """Raised internally when an allocation cannot be satisfied; the scheduler preempts."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[int, int] = {}  # chain hash -> block id
        self.prefix_hit_tokens = 0  # tokens served from the prefix cache, over the engine's life

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def blocks_needed(self, num_slots: int) -> int:
        return -(-num_slots // self.block_size)

    # ---- allocation -------------------------------------------------------------------------

    def _take_free(self) -> int:
        if not self.free:
            raise NoFreeBlocksError
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.cached.get(block.hash) == block_id:
            del self.cached[block.hash]
        block.hash, block.token_ids, block.ref_count, block.draft_kv = None, (), 1, False
        return block_id

    def can_allocate(self, seq: Sequence, num_slots: int) -> bool:
        return self.blocks_needed(num_slots) - len(seq.block_table) <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_slots: int) -> None:
        """Grow ``seq``'s table to cover ``num_slots`` token slots."""
        need = self.blocks_needed(num_slots) - len(seq.block_table)
        if need > self.num_free_blocks:
            raise NoFreeBlocksError
        for _ in range(need):
            seq.block_table.append(self._take_free())

    def admit(self, seq: Sequence) -> int:
        """Give a new (or preempted) sequence its prefix-cached blocks; return cached tokens.

        Only full blocks strictly before the last token are eligible: the last token is always
        scored, because its logits decide what comes next.
        """
        assert not seq.block_table
        seq.block_hashes, seq.draft_blocks = [], 0
        if not self.enable_prefix_caching or seq.scores_prompt:  # every position gets its row
            return 0
        bs = self.block_size
        prev: int | None = None
        for i in range((len(seq.token_ids) - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = hash((prev, tokens))
            block_id = self.cached.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
            seq.block_table.append(block_id)
            seq.block_hashes.append(h)
            if block.draft_kv and seq.draft_blocks == len(seq.block_table) - 1:
                seq.draft_blocks += 1
            prev = h
        cached = len(seq.block_table) * bs
        self.prefix_hit_tokens += cached
        return cached

    def trim(self, seq: Sequence, num_slots: int) -> None:
        """Roll back: release blocks beyond ``num_slots`` slots (rejected speculation)."""
        keep = self.blocks_needed(num_slots)
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop())
        del seq.block_hashes[keep:]

    def free_all(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table.clear()
        seq.block_hashes.clear()
        seq.draft_blocks = 0

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} released twice"
        if block.ref_count == 0:
            self.free[block_id] = None

    # ---- prefix-cache registration ------------------------------------------------------------

    def register(
        self, seq: Sequence, num_ready_tokens: int, num_draft_tokens: int | None = None
    ) -> None:
        """Hash every full block whose tokens all have valid KV in the target's pool, and mark
        those whose tokens also have it in the in-process draft's (``num_draft_tokens``; None:
        no in-process draft, every block counts as holding it).

        Called after each round with the count of committed tokens whose KV is written; several
        blocks may fill in one round, and each is hashed over its own tokens.
        """
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        prev = seq.block_hashes[-1] if seq.block_hashes else None
        for i in range(len(seq.block_hashes), min(num_ready_tokens // bs, len(seq.block_table))):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = hash((prev, tokens))
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash, block.token_ids = h, tokens
                self.cached.setdefault(h, block.block_id)
            seq.block_hashes.append(h)
            prev = h
        hashed = len(seq.block_hashes)
        draft = hashed if num_draft_tokens is None else min(num_draft_tokens // bs, hashed)
        for i in range(seq.draft_blocks, draft):
            self.blocks[seq.block_table[i]].draft_kv = True
        seq.draft_blocks = max(seq.draft_blocks, draft)
