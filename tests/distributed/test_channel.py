"""The target <-> worker message channel: one fixed-size send for small messages, a second for
whatever does not fit, objects (tensors included) intact both ways."""

from __future__ import annotations

import threading

import torch

from saguaro.distributed.channel import FIRST, Channel, free_port, pack, unpack


def test_small_and_large_messages_round_trip():
    port = free_port()
    target = Channel(0, "127.0.0.1", port, timeout_s=30)
    messages = [
        (2, {"tokens": [1, 2, 3]}),
        (3, None),
        (4, torch.arange(3 * FIRST // 4, dtype=torch.float32)),  # 3x FIRST bytes: two sends
        (5, b"x" * (FIRST - 16)),  # pickled, just over the first part: the edge
    ]
    echoed = []

    def worker() -> None:
        ch = Channel(1, "127.0.0.1", port, timeout_s=30).connect()
        for _ in messages:
            kind, obj = ch.recv(0)
            ch.send(0, kind + 10, obj)
        ch.close()

    thread = threading.Thread(target=worker)
    thread.start()
    target.connect()
    for kind, obj in messages:
        target.send(1, kind, obj)
        echoed.append(target.recv(1))
    thread.join(timeout=30)
    target.close()
    for (kind, obj), (got_kind, got) in zip(messages, echoed, strict=True):
        assert got_kind == kind + 10
        if isinstance(obj, torch.Tensor):
            assert torch.equal(got, obj)
        else:
            assert got == obj


def test_doorbell_counts_rings_from_either_side():
    port = free_port()
    target = Channel(0, "127.0.0.1", port, timeout_s=30)
    worker = Channel(1, "127.0.0.1", port, timeout_s=30)  # the store alone: no process group
    assert worker.rings() == 0
    target.ring()
    target.ring()
    assert worker.rings() == 2
    worker.ring()
    assert target.rings() == 3
    worker.close()
    target.close()


def _listening_addresses(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) with a socket listening on port."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    found.add(addr)
    return found


def test_rendezvous_listens_on_the_configured_address_only():
    target = Channel(0, "127.0.0.1", 0, timeout_s=5)
    try:
        assert _listening_addresses(target.port) == {"0100007F"}  # 127.0.0.1, nothing else
    finally:
        target.close()
    assert _listening_addresses(target.port) == set()


def test_cpu_tensors_travel_as_their_own_elements():
    """Every dtype and shape arrives equal and writable; a view carries its own elements, not
    the storage it views, so a row of a large tensor makes a small message."""
    big = torch.randn(1000, 64)
    message = {
        "row": big[3],
        "column": big[:, 5],  # not contiguous
        "bf16": torch.randn(2, 3).bfloat16(),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(7, dtype=torch.int64),
        "empty": torch.zeros(0, 4, dtype=torch.int32),
        "many": [torch.arange(i % 8, dtype=torch.int64) for i in range(200)],
    }
    first, rest, lane = pack(1, message)
    assert rest is None and not lane  # views of a 256 KB tensor among them, yet one part
    kind, got, _ = unpack(first, rest)
    assert kind == 1
    for name in ("row", "column", "bf16", "bool", "scalar", "empty"):
        want = message[name]
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
    assert all(torch.equal(a, b) for a, b in zip(got["many"], message["many"], strict=True))
    got["row"] += 1  # the receiver owns its tensors
    assert torch.equal(got["row"], big[3] + 1)


def test_device_lane_carries_tensors_beside_the_pickle():
    """With a lane open, the message's tensors (on the lane's device type) travel over it: the
    pickle names them only, and they arrive intact on the receiver's device."""
    port = free_port()
    target = Channel(0, "127.0.0.1", port, timeout_s=30)
    big = torch.arange(4 * FIRST, dtype=torch.float32)  # 16x FIRST bytes
    message = {"q": big, "ids": [torch.tensor([[1, 2], [3, 4]]), torch.zeros(0)], "n": 3}
    got = {}

    def worker() -> None:
        ch = Channel(1, "127.0.0.1", port, timeout_s=30).connect()
        ch.open_lane(torch.device("cpu"))
        got["message"] = ch.recv(0)
        ch.send(0, 9, got["message"][1])
        ch.close()

    thread = threading.Thread(target=worker)
    thread.start()
    target.connect()
    target.open_lane(torch.device("cpu"))
    target.send(1, 7, message)
    kind, echoed = target.recv(1)
    thread.join(timeout=30)
    target.close()
    first, rest, lane = pack(7, message, "cpu")
    assert rest is None and len(lane) == 3  # the pickle fits one part: the tensors left it
    for kind_got, obj in [got["message"], (kind, echoed)]:
        assert kind_got in (7, 9)
        assert torch.equal(obj["q"], big) and obj["n"] == 3
        assert torch.equal(obj["ids"][0], message["ids"][0]) and obj["ids"][1].shape == (0,)
