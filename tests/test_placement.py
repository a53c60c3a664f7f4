"""Placement on CPU: every engine computes on its own cores and threads, whatever ran before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from saguaro import LLM, SamplingParams, placement
from saguaro.config import EngineConfig
from saguaro.engine.engine import LLMEngine
from saguaro.errors import ModelLoadError
from saguaro.speculation.factory import make_proposer


def _all_threads() -> set[frozenset[int]]:
    """The distinct core sets of this process's threads."""
    out = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            out.add(frozenset(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            pass
    return out


@pytest.fixture
def cores():
    cores = placement.process_cpus()
    assert len(cores) >= 2, "placement is tested on two cores or more"
    before = placement.current()
    yield cores
    placement._apply(before)


def test_place_and_release_follow_the_owner(cores, monkeypatch):
    monkeypatch.setattr(placement, "_original", None)
    monkeypatch.setattr(placement, "_owner", None)
    a, b = object(), object()
    original = placement.current()
    placement.place(a, placement.Placement(tuple(cores[:1]), 1))
    assert _all_threads() == {frozenset(cores[:1])} and torch.get_num_threads() == 1
    # Planning sees the cores the process had, not the ones an engine narrowed it to.
    assert placement.process_cpus() == list(original.cpus)
    placement.place(b, placement.Placement(tuple(cores), 2))
    assert _all_threads() == {frozenset(cores)} and torch.get_num_threads() == 2
    placement.release(a)  # not in force: nothing changes
    assert placement.current() == placement.Placement(tuple(cores), 2)
    placement.release(b)
    assert placement.current() == original


def test_each_engine_runs_on_its_own_cores_whatever_ran_before(cores, tiny_llama, tiny_draft):
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    ar = LLM(model=str(tiny_llama), max_model_len=64, device="cpu")
    ssd = LLM(model=str(tiny_llama), draft=str(tiny_draft), mode="ssd", max_model_len=64)
    try:
        for _ in range(2):
            # Another library narrows the process and changes torch's threads in between.
            os.sched_setaffinity(0, cores[-1:])
            torch.set_num_threads(3)
            ar.generate("x", params)
            assert _all_threads() == {frozenset(cores)}
            assert torch.get_num_threads() == len(cores)  # AR: every core, a thread each
            ssd.generate("x", params)
            target = ssd.config.target_cpus
            assert target and not set(target) & set(ssd.config.draft_cpus)
            assert _all_threads() == {frozenset(target)} and torch.get_num_threads() == len(target)
    finally:
        ssd.close()
        ar.close()


def test_an_engine_that_fails_to_start_gives_the_process_back(cores, tmp_path):
    before = placement.current()
    missing = str(tmp_path / "missing")
    cfg = EngineConfig(model=missing, draft=missing, mode="ssd", device="cpu")
    assert cfg.target_cpus
    with pytest.raises(ModelLoadError, match="does not exist"):
        LLMEngine(cfg, make_proposer)
    assert placement.current() == before


def test_split_cores():
    assert placement.split_cores([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert placement.split_cores([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert placement.split_cores([4, 5], 1) == [[4, 5]]
    assert placement.split_cores([7], 3) == [[7], [7], [7]]  # too few cores: ranks share them
    assert placement.split_cores([0, 1], 3) == [[0], [1], [0]]


def _rank_threads(pid: int) -> tuple[set[frozenset[int]], int]:
    """The core sets of ``pid``'s threads, and the OMP thread count it was started with."""
    cores = {frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")}
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    omp = next(int(e.split(b"=")[1]) for e in env if e.startswith(b"OMP_NUM_THREADS="))
    return cores, omp


def test_tensor_parallel_ranks_each_get_a_share_of_the_cores(cores, tiny_llama):
    shares = placement.split_cores(cores, 2)
    llm = LLM(model=str(tiny_llama), max_model_len=64, device="cpu", tensor_parallel_size=2)
    try:
        llm.generate("x", SamplingParams(temperature=0, max_tokens=4))
        assert _all_threads() == {frozenset(shares[0])}  # rank 0: this process
        assert torch.get_num_threads() == len(shares[0])
        (pid,) = llm.engine.tensor_parallel.pids()
        assert _rank_threads(pid) == ({frozenset(shares[1])}, len(shares[1]))
    finally:
        llm.close()


def test_resolve_device():
    assert placement.resolve_device("cpu") == "cpu"
    assert placement.resolve_device("cuda:1") == "cuda:1"
    assert placement.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
