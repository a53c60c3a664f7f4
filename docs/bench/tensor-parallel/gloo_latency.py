"""What one collective costs between two processes on this machine: gloo (the tensor-parallel
target's CPU backend) against a raw TCP round trip of the same size.

    python docs/bench/tensor-parallel/gloo_latency.py [--bytes 4096] [--iters 300]

Each process is pinned to its own core with one torch thread, as tensor-parallel ranks are. A
CPU tensor-parallel step runs two all-reduces per layer, one for the embedding and an all-gather
of the logits, so this latency times (2 x layers + 2) bounds what TP can gain on CPU here.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WARM_UP = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(fn, iters: int) -> float:
    for _ in range(WARM_UP):
        fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters * 1e6


def _gloo(rank: int, port: int, nbytes: int, iters: int) -> None:
    os.sched_setaffinity(0, [rank % os.cpu_count()])
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=30))
    pg = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=30))
    x = torch.zeros(nbytes // 4)
    y = torch.empty_like(x)
    peer = 1 - rank

    def pingpong() -> None:
        if rank == 0:
            pg.send([x], peer, 0).wait()
            pg.recv([y], peer, 0).wait()
        else:
            pg.recv([y], peer, 0).wait()
            pg.send([x], peer, 0).wait()

    cases = {
        "gloo send + recv round trip": pingpong,
        "gloo broadcast": lambda: pg.broadcast(x, 0).wait(),
        "gloo all-reduce": lambda: pg.allreduce([x]).wait(),
    }
    for name, fn in cases.items():
        us = _timed(fn, iters)
        if rank == 0:
            print(f"{name:32s} {us:8.0f} us")


def _tcp(nbytes: int, iters: int) -> float:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    msg = b"x" * nbytes

    def echo(port: int) -> None:
        os.sched_setaffinity(0, [1 % os.cpu_count()])
        conn = socket.create_connection(("127.0.0.1", port))
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(WARM_UP + iters):
            got = 0
            while got < nbytes:
                got += len(conn.recv(1 << 16))
            conn.sendall(msg)

    child = mp.get_context("fork").Process(target=echo, args=(server.getsockname()[1],))
    child.start()
    os.sched_setaffinity(0, [0])
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def round_trip() -> None:
        conn.sendall(msg)
        got = 0
        while got < nbytes:
            got += len(conn.recv(1 << 16))

    us = _timed(round_trip, iters)
    child.join()
    return us


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=4096, help="message size (one hidden state)")
    p.add_argument("--iters", type=int, default=300)
    args = p.parse_args()
    print(f"{'raw TCP round trip':32s} {_tcp(args.bytes, args.iters):8.0f} us")
    mp.spawn(_gloo, args=(_free_port(), args.bytes, args.iters), nprocs=2)


if __name__ == "__main__":
    main()
