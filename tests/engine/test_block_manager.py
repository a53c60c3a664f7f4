"""Paged blocks: allocation, rollback, prefix caching (verified, chained) and eviction."""

from __future__ import annotations

import pytest

from saguaro.core.sequence import Sequence
from saguaro.engine.block_manager import BlockManager, NoFreeBlocksError
from saguaro.sampling import SamplingParams


def make_seq(tokens, seq_id=0):
    return Sequence(seq_id, list(tokens), len(tokens), SamplingParams(), seed=0)


def test_allocate_trim_free_roundtrip():
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = make_seq(range(10))
    bm.allocate(seq, 10 + 5)  # look-ahead for 5 proposals
    assert len(seq.block_table) == 4 and bm.num_free_blocks == 4
    bm.trim(seq, 11)  # 1 proposal accepted + bonus: roll back the rest
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    bm.free_all(seq)
    assert bm.num_free_blocks == 8 and not seq.block_table


def test_out_of_blocks_raises():
    bm = BlockManager(num_blocks=2, block_size=4)
    seq = make_seq(range(3))
    assert not bm.can_allocate(seq, 9)
    with pytest.raises(NoFreeBlocksError):
        bm.allocate(seq, 9)


def test_shared_prefix_reused_and_divergent_prefix_not():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = make_seq(range(13), 0)
    assert bm.admit(a) == 0
    bm.allocate(a, 13)
    bm.register(a, 12)  # 3 full blocks computed
    assert len(a.block_hashes) == 3
    b = make_seq(list(range(9)) + [99, 98, 97, 96, 95], 1)
    assert bm.admit(b) == 8  # blocks 0-1 shared, block 2 differs
    assert b.block_table == a.block_table[:2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    c = make_seq([0, 1, 2, 4] + list(range(4, 12)), 2)  # differs inside the first block
    assert bm.admit(c) == 0
    # A prefix reaching the last token never reuses the block holding it.
    d = make_seq(range(12), 3)
    assert bm.admit(d) == 8


def test_chain_hash_depends_on_whole_prefix():
    bm = BlockManager(num_blocks=16, block_size=2)
    a = make_seq([1, 2, 3, 4, 5], 0)
    bm.admit(a)
    bm.allocate(a, 5)
    bm.register(a, 4)
    # Same second block, different first block: must not match the second block.
    b = make_seq([9, 9, 3, 4, 5], 1)
    assert bm.admit(b) == 0


def test_hash_collision_is_verified_by_tokens():
    bm = BlockManager(num_blocks=8, block_size=2)
    a = make_seq([1, 2, 3], 0)
    bm.admit(a)
    bm.allocate(a, 3)
    bm.register(a, 2)
    block = bm.blocks[a.block_table[0]]
    block.token_ids = (7, 7)  # simulate a colliding hash with other content
    b = make_seq([1, 2, 3], 1)
    assert bm.admit(b) == 0


def test_freed_blocks_stay_cached_until_reused():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = make_seq([1, 2, 3, 4, 5], 0)
    bm.admit(a)
    bm.allocate(a, 5)
    bm.register(a, 4)
    bm.free_all(a)
    b = make_seq([1, 2, 3, 4, 6], 1)
    assert bm.admit(b) == 4  # served from freed-but-cached blocks
    bm.free_all(b)
    # Reallocating every block evicts the cached hashes.
    c = make_seq(range(100, 108), 2)
    bm.admit(c)
    bm.allocate(c, 8)
    d = make_seq([1, 2, 3, 4, 5], 3)
    assert bm.admit(d) == 0


def test_register_hashes_each_block_filled_in_one_round():
    bm = BlockManager(num_blocks=8, block_size=2)
    a = make_seq([1], 0)
    bm.admit(a)
    a.token_ids += [2, 3, 4, 5, 6]  # a speculative round committed 5 tokens at once
    bm.allocate(a, 6)
    bm.register(a, 5)
    assert len(a.block_hashes) == 2
    assert bm.blocks[a.block_table[0]].token_ids == (1, 2)
    assert bm.blocks[a.block_table[1]].token_ids == (3, 4)


def test_blocks_are_cached_before_the_draft_and_say_how_far_its_kv_goes():
    """A block is cached once the target's KV is in it, whatever the in-process draft has; a
    sequence admitted onto cached blocks learns how many leading ones hold the draft's KV, and
    a block is marked once the draft catches up on it."""
    bm = BlockManager(num_blocks=8, block_size=2)
    a = make_seq([1, 2, 3, 4, 5, 6, 7], 0)
    bm.admit(a)
    bm.allocate(a, 7)
    bm.register(a, 7, num_draft_tokens=2)  # target: 3 full blocks; draft: the first only
    assert len(a.block_hashes) == 3 and a.draft_blocks == 1
    b = make_seq([1, 2, 3, 4, 5, 6, 7], 1)
    assert bm.admit(b) == 6 and b.draft_blocks == 1  # its draft may start at token 2
    bm.register(a, 7, num_draft_tokens=6)  # the draft caught up
    assert a.draft_blocks == 3
    c = make_seq([1, 2, 3, 4, 5, 6, 7], 2)
    assert bm.admit(c) == 6 and c.draft_blocks == 3
    bm.free_all(c)
    assert c.draft_blocks == 0
