"""A message channel between two ranks over ``torch.distributed`` point-to-point operations.

Rank 0 (the target) hosts the rendezvous store; rank 1 (a draft worker) connects to it, from the
same machine or another host. Construction opens the store (rank 0 learns its port, so a free
one can be picked and handed to a worker it launches); :meth:`connect` then blocks until both
ranks have joined. Each channel owns its own process group (not the global default
group), so several engines can run side by side in one process, each on its own port.

Wire format of one message: ``uint8[FIRST]`` holding a header ``int64[2] = (kind, nbytes)`` and
the first bytes of the pickled message object (tensors inside are pickled by torch), zero-padded;
then, only if the object did not fit, ``uint8[nbytes - room]`` with the rest. One send per
message as a rule (a round's request, a greedy reply) and one message per direction per round:
a second small send right behind a first one can wait on the socket for milliseconds, on the
round's critical path. Both ends are saguaro processes the user started: pickle is the trust
boundary, which is why the rendezvous binds to loopback unless told otherwise.

A doorbell rides beside the messages: :meth:`ring` counts, in the rendezvous store, a message
about to be sent, and :meth:`rings` reads the count. A gloo receive cannot be polled, but the store
can be read at any time for one small request, so a busy peer can check between steps of work
whether its next request is already on the way (the draft worker cuts its cache build short when
it is).
"""

from __future__ import annotations

import pickle
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# Bytes of the first (fixed-size) part of every message: room for a round's request and a
# greedy reply, so that most messages take one send.
FIRST = 64 * 1024
_HEADER = 16  # int64 kind, int64 nbytes
_ROOM = FIRST - _HEADER  # body bytes the first part carries
_DOORBELL = "saguaro/doorbell"
# Joining may wait for a peer that is still importing torch and loading its model.
CONNECT_TIMEOUT_S = 300.0


class ChannelError(RuntimeError):
    """The peer died, closed the connection, or did not answer in time."""


def _listen(addr: str, port: int) -> socket.socket:
    """A listening TCP socket on ``addr:port`` (port 0: a free one)."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen()
    except OSError as e:
        sock.close()
        raise ChannelError(f"cannot listen on {addr}:{port}: {e}") from e
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def pack(kind: int, obj: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One message in the wire format above: the first part, and the rest (None: it fit)."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    first = torch.zeros(FIRST, dtype=torch.uint8)
    first[:_HEADER] = torch.tensor([kind, len(body)], dtype=torch.int64).view(torch.uint8)
    head = body[:_ROOM]
    if head:
        first[_HEADER : _HEADER + len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    rest = None
    if len(body) > _ROOM:
        rest = torch.frombuffer(bytearray(body[_ROOM:]), dtype=torch.uint8)
    return first, rest


def rest_buffer(first: torch.Tensor) -> torch.Tensor | None:
    """Room for the rest of the message whose first part is ``first`` (None: it all fit)."""
    nbytes = int(first[:_HEADER].view(torch.int64)[1])
    return torch.empty(nbytes - _ROOM, dtype=torch.uint8) if nbytes > _ROOM else None


def unpack(first: torch.Tensor, rest: torch.Tensor | None) -> tuple[int, Any]:
    """``(kind, object)`` of a message received as ``first`` and ``rest``."""
    kind, nbytes = (int(x) for x in first[:_HEADER].view(torch.int64))
    body = first[_HEADER : _HEADER + min(nbytes, _ROOM)].numpy().tobytes()
    if rest is not None:
        body += rest.numpy().tobytes()
    return kind, pickle.loads(body)


class Channel:
    def __init__(
        self,
        rank: int,
        addr: str,
        port: int,
        timeout_s: float,
        world_size: int = 2,
        backend: str = "gloo",
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        if backend != "gloo":
            # Control messages are small; NCCL would force them through the GPU for nothing.
            raise ValueError(f"unsupported channel backend {backend!r} (control channel: gloo)")
        self.rank = rank
        self.timeout = timedelta(seconds=timeout_s)  # per message, once connected
        self.connect_timeout = timedelta(seconds=connect_timeout_s)
        # The store's own listener would take every interface; rank 0 hands it a socket bound
        # to the configured address instead, so a loopback rendezvous is reachable from
        # loopback only.
        listener = _listen(addr, port) if rank == 0 else None
        try:
            self.store = dist.TCPStore(
                addr,
                port,
                world_size,
                rank == 0,
                timeout=self.connect_timeout,
                wait_for_workers=False,
                **({"master_listen_fd": listener.fileno()} if listener else {}),
            )
            self.port = self.store.port
        except (RuntimeError, dist.DistStoreError) as e:
            if listener is not None:
                listener.close()
            raise ChannelError(f"rendezvous store on {addr}:{port} failed: {e}") from e
        if listener is not None:
            listener.detach()  # the store owns the descriptor from here on
        self.addr, self.world_size = addr, world_size
        self.pg: dist.ProcessGroupGloo | None = None

    def connect(self) -> Channel:
        try:
            self.pg = dist.ProcessGroupGloo(
                self.store, self.rank, self.world_size, self.connect_timeout
            )
        except (RuntimeError, dist.DistStoreError) as e:
            raise ChannelError(f"rendezvous on {self.addr}:{self.port} failed: {e}") from e
        return self

    def send(self, peer: int, kind: int, obj: Any) -> None:
        first, rest = pack(kind, obj)
        try:
            self.pg.send([first], peer, 0).wait(self.timeout)
            if rest is not None:
                self.pg.send([rest], peer, 1).wait(self.timeout)
        except RuntimeError as e:
            raise ChannelError(f"send to rank {peer} failed: {e}") from e

    def recv(self, peer: int, timeout_s: float | None = None) -> tuple[int, Any]:
        timeout = self.timeout if timeout_s is None else timedelta(seconds=timeout_s)
        first = torch.empty(FIRST, dtype=torch.uint8)
        try:
            self.pg.recv([first], peer, 0).wait(timeout)
            rest = rest_buffer(first)
            if rest is not None:
                self.pg.recv([rest], peer, 1).wait(timeout)
        except RuntimeError as e:
            raise ChannelError(f"no answer from rank {peer}: {e}") from e
        return unpack(first, rest)

    def ring(self) -> None:
        """Count one message about to be sent (see the module docstring)."""
        try:
            self.store.add(_DOORBELL, 1)
        except (RuntimeError, dist.DistStoreError) as e:
            raise ChannelError(f"rendezvous store on {self.addr}:{self.port} failed: {e}") from e

    def rings(self) -> int:
        """How many times either side has rung so far."""
        try:
            return self.store.add(_DOORBELL, 0)
        except (RuntimeError, dist.DistStoreError) as e:
            raise ChannelError(f"rendezvous store on {self.addr}:{self.port} failed: {e}") from e

    def close(self) -> None:
        """Drop the process group and the store; rank 0's listening port closes with it."""
        self.pg = None
        self.store = None
