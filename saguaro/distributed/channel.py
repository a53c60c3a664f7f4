"""A message channel between two ranks over ``torch.distributed`` point-to-point operations.

Rank 0 (the target) hosts the rendezvous store; rank 1 (a draft worker) connects to it, from the
same machine or another host. Construction opens the store (rank 0 learns its port, so a free
one can be picked and handed to a worker it launches); :meth:`connect` then blocks until both
ranks have joined. Each channel owns its own process group (not the global default
group), so several engines can run side by side in one process, each on its own port.

Wire format of one message: ``uint8[FIRST]`` holding a header ``int64[2] = (kind, nbytes)`` and
the first bytes of the pickled message object, zero-padded;
then, only if the object did not fit, ``uint8[nbytes - room]`` with the rest. One send per
message as a rule (a round's request, a greedy reply) and one message per direction per round:
a second small send right behind a first one can wait on the socket for milliseconds, on the
round's critical path. Both ends are saguaro processes the user started: pickle is the trust
boundary, which is why the rendezvous binds to loopback unless told otherwise.

A device lane may ride beside them too (:meth:`open_lane`, both ends): tensors of a message that
live on the lane's device type then leave the pickle (each becomes a reference to its shape and
dtype) and travel peer to peer over a process group of their own, NCCL between GPUs, after the
message that names them; the receiver allocates them on its own device. Between two GPUs that
is device to device, without passing through either host.

A doorbell rides beside the messages: :meth:`ring` counts, in the rendezvous store, a message
about to be sent, and :meth:`rings` reads the count. A gloo receive cannot be polled, but the store
can be read at any time for one small request, so a busy peer can check between steps of work
whether its next request is already on the way (the draft worker cuts its cache build short when
it is). Other bells, each counted under its own name, signal events that no message follows at
once (the target has released every sequence it sent).
"""

from __future__ import annotations

import io
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
_LANE = "saguaro/lane"  # the persistent id tag of a tensor sent over the device lane
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


def _tensor_from_bytes(dtype: torch.dtype, shape: tuple[int, ...], data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    """Pickles a message with its CPU tensors as their dtype, shape and bytes.

    Torch's own reduction serialises each tensor's whole storage through its serialisation
    machinery: about 0.15 ms a tensor each way, and a round's message at a batch of hundreds
    holds a tensor or two per sequence. Bytes take microseconds. A view travels as its own
    elements, not as the storage it views.
    """

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is torch.Tensor
            and obj.device.type == "cpu"
            and obj.layout == torch.strided
            and not obj.requires_grad
            and not obj.is_quantized
        ):
            data = obj.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            return _tensor_from_bytes, (obj.dtype, tuple(obj.shape), data)
        return NotImplemented


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf).dump(obj)
    return buf.getvalue()


class _LanePickler(_Pickler):
    """Pickles a message but for its tensors on ``device_type``, collected in ``tensors``
    (persistent ids are consulted before the reducer, so those never reach it)."""

    def __init__(self, file: io.BytesIO, device_type: str) -> None:
        super().__init__(file)
        self.device_type = device_type
        self.tensors: list[torch.Tensor] = []

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and obj.device.type == self.device_type:
            self.tensors.append(obj.contiguous())
            return (_LANE, tuple(obj.shape), obj.dtype)
        return None


class _LaneUnpickler(pickle.Unpickler):
    """Unpickles a message, allocating its lane tensors on ``device`` (in ``tensors``)."""

    def __init__(self, file: io.BytesIO, device: torch.device) -> None:
        super().__init__(file)
        self.device = device
        self.tensors: list[torch.Tensor] = []

    def persistent_load(self, pid: Any) -> torch.Tensor:
        tag, shape, dtype = pid
        if tag != _LANE:
            raise pickle.UnpicklingError(f"unknown persistent id {tag!r}")
        t = torch.empty(shape, dtype=dtype, device=self.device)
        self.tensors.append(t)
        return t


def open_store(
    addr: str, port: int, world_size: int, is_master: bool, timeout: timedelta
) -> dist.TCPStore:
    """A rendezvous store on ``addr:port`` (port 0: a free one, then ``store.port``). The
    store's own listener would take every interface; the master hands it a socket bound to
    ``addr`` instead, so a loopback rendezvous is reachable from loopback only."""
    listener = _listen(addr, port) if is_master else None
    try:
        store = dist.TCPStore(
            addr,
            port,
            world_size,
            is_master,
            timeout=timeout,
            wait_for_workers=False,
            **({"master_listen_fd": listener.fileno()} if listener else {}),
        )
    except (RuntimeError, dist.DistStoreError) as e:
        if listener is not None:
            listener.close()
        raise ChannelError(f"rendezvous store on {addr}:{port} failed: {e}") from e
    if listener is not None:
        listener.detach()  # the store owns the descriptor from here on
    return store


def pack(
    kind: int, obj: Any, lane_device: str | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
    """One message in the wire format above: the first part, the rest (None: it fit), and the
    tensors on ``lane_device`` (a device type) that left the pickle for the lane."""
    if lane_device is None:
        body, lane = _dumps(obj), []
    else:
        buf = io.BytesIO()
        pickler = _LanePickler(buf, lane_device)
        pickler.dump(obj)
        body, lane = buf.getvalue(), pickler.tensors
    first = torch.zeros(FIRST, dtype=torch.uint8)
    first[:_HEADER] = torch.tensor([kind, len(body)], dtype=torch.int64).view(torch.uint8)
    head = body[:_ROOM]
    if head:
        first[_HEADER : _HEADER + len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    rest = None
    if len(body) > _ROOM:
        rest = torch.frombuffer(bytearray(body[_ROOM:]), dtype=torch.uint8)
    return first, rest, lane


def rest_buffer(first: torch.Tensor) -> torch.Tensor | None:
    """Room for the rest of the message whose first part is ``first`` (None: it all fit)."""
    nbytes = int(first[:_HEADER].view(torch.int64)[1])
    return torch.empty(nbytes - _ROOM, dtype=torch.uint8) if nbytes > _ROOM else None


def unpack(
    first: torch.Tensor, rest: torch.Tensor | None, lane_device: torch.device | None = None
) -> tuple[int, Any, list[torch.Tensor]]:
    """``(kind, object, lane tensors)`` of a message received as ``first`` and ``rest``; the
    lane tensors are allocated on ``lane_device``, still to be received into."""
    kind, nbytes = (int(x) for x in first[:_HEADER].view(torch.int64))
    body = first[_HEADER : _HEADER + min(nbytes, _ROOM)].numpy().tobytes()
    if rest is not None:
        body += rest.numpy().tobytes()
    if lane_device is None:
        return kind, pickle.loads(body), []
    unpickler = _LaneUnpickler(io.BytesIO(body), lane_device)
    obj = unpickler.load()
    return kind, obj, unpickler.tensors


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
        self.store = open_store(addr, port, world_size, rank == 0, self.connect_timeout)
        self.port = self.store.port
        self.addr, self.world_size = addr, world_size
        self.pg: dist.ProcessGroupGloo | None = None
        self.lane: dist.ProcessGroup | None = None
        self.lane_device: torch.device | None = None

    def connect(self) -> Channel:
        try:
            self.pg = dist.ProcessGroupGloo(
                self.store, self.rank, self.world_size, self.connect_timeout
            )
        except (RuntimeError, dist.DistStoreError) as e:
            raise ChannelError(f"rendezvous on {self.addr}:{self.port} failed: {e}") from e
        return self

    def open_lane(self, device: torch.device) -> None:
        """Send this end's tensors on ``device``'s type over a lane of their own (NCCL between
        GPUs, gloo otherwise), and receive the peer's onto ``device``. Both ends call it, at the
        same point of their conversation; it returns once both have."""
        store = dist.PrefixStore("saguaro/lane", self.store)
        try:
            if device.type == "cuda":
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = self.connect_timeout
                self.lane = dist.ProcessGroupNCCL(store, self.rank, self.world_size, options)
            else:
                self.lane = dist.ProcessGroupGloo(
                    store, self.rank, self.world_size, self.connect_timeout
                )
        except (RuntimeError, dist.DistStoreError) as e:
            raise ChannelError(f"device lane on {device} failed: {e}") from e
        self.lane_device = device

    def send(self, peer: int, kind: int, obj: Any) -> None:
        lane_type = self.lane_device.type if self.lane_device is not None else None
        first, rest, tensors = pack(kind, obj, lane_type)
        try:
            self.pg.send([first], peer, 0).wait(self.timeout)
            if rest is not None:
                self.pg.send([rest], peer, 1).wait(self.timeout)
            for i, t in enumerate(tensors):
                self.lane.send([t], peer, i).wait(self.timeout)
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
            kind, obj, tensors = unpack(first, rest, self.lane_device)
            for i, t in enumerate(tensors):
                self.lane.recv([t], peer, i).wait(timeout)
        except RuntimeError as e:
            raise ChannelError(f"no answer from rank {peer}: {e}") from e
        return kind, obj

    def ring(self, bell: str = _DOORBELL, times: int = 1) -> None:
        """Count one message about to be sent, or ``times`` events of another ``bell`` (see the
        module docstring)."""
        try:
            self.store.add(bell, times)
        except (RuntimeError, dist.DistStoreError) as e:
            raise ChannelError(f"rendezvous store on {self.addr}:{self.port} failed: {e}") from e

    def rings(self, bell: str = _DOORBELL) -> int:
        """How many times either side has rung ``bell`` so far."""
        try:
            return self.store.add(bell, 0)
        except (RuntimeError, dist.DistStoreError) as e:
            raise ChannelError(f"rendezvous store on {self.addr}:{self.port} failed: {e}") from e

    def close(self) -> None:
        """Drop the process group and the store; rank 0's listening port closes with it."""
        self.pg = self.lane = self.lane_device = None
        self.store = None
