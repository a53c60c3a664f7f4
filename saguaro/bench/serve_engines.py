"""The servers a serving benchmark drives: ``saguaro serve`` in a decoding mode, or llama.cpp's
``llama-server`` with or without its draft, each started as a real process pinned to the same
cores, waited for until it answers, and stopped (its whole process group) afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from saguaro.config import paper_layout
from saguaro.models.catalog import resolve_model
from saguaro.options import flag, show

# Engines by name: saguaro's modes, then llama-server alone and with its draft.
SAGUARO_ENGINES: tuple[str, ...] = ("ar", "sd", "ssd", "auto")
LLAMA_AR, LLAMA_SD = "llama.cpp", "llama.cpp-sd"
ENGINES: tuple[str, ...] = (*SAGUARO_ENGINES, LLAMA_AR, LLAMA_SD)
# Where the servers compute: every one on all the cores given ("equal"), or every target on the
# first of them with one thread and SSD's draft worker on the next ("paper", the layout of SSD's
# paper: the draft's hardware is beyond the target's).
LAYOUTS: tuple[str, ...] = ("equal", "paper")
HOST = "127.0.0.1"
READY_POLL_S = 0.5  # between two readiness probes
PROBE_TIMEOUT_S = 5.0  # one readiness probe or /metrics read
STOP_GRACE_S = 30.0  # after SIGTERM, before the process group is killed
LOG_TAIL_CHARS = 3000  # of a server's log, quoted when it fails to start
# The directory holding the saguaro package this benchmark runs from (this file is
# saguaro/bench/serve_engines.py): put first on a saguaro server's PYTHONPATH, so that the server
# runs the same code as the benchmark even where another copy is installed.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class EngineSpec:
    """One server under test: its display name and the command that starts it (without the
    port, which each start chooses)."""

    name: str
    kind: str  # "saguaro" or "llama"
    argv: tuple[str, ...]

    def env(self) -> dict[str, str]:
        """The server's environment: this process's, and for saguaro this saguaro first."""
        env = dict(os.environ)
        if self.kind == "saguaro":
            paths = [str(PACKAGE_ROOT), *filter(None, [env.get("PYTHONPATH")])]
            env["PYTHONPATH"] = os.pathsep.join(paths)
        return env


@dataclass(frozen=True)
class Launch:
    """What every server of a run shares: models, slots, context, cores and threads."""

    model: str
    draft: str
    k: int  # proposals per round: saguaro's --k, llama-server's --spec-draft-n-max
    slots: int  # sequences served at once: saguaro's --max-num-seqs, llama-server's -np
    context_per_slot: int  # saguaro's --max-model-len; llama-server's -c is slots times this
    cpus: tuple[int, ...]  # every server is pinned to these cores (taskset)
    threads: int  # llama-server's -t / -tb / -td (saguaro: a thread per core it computes on)
    llama_server: str = "llama-server"
    saguaro_args: tuple[str, ...] = ()
    llama_args: tuple[str, ...] = ()
    layout: str = "equal"  # of LAYOUTS

    def cpus_of(self, spec: EngineSpec) -> tuple[int, ...]:
        """The cores ``spec``'s server is pinned to: in the paper's layout llama-server's target
        (and draft) keep to the first; saguaro places its target there itself and its SSD
        worker on the next."""
        if self.layout == "paper" and spec.kind == "llama":
            return self.cpus[:1]
        return self.cpus

    def llama_threads(self) -> int:
        return 1 if self.layout == "paper" else self.threads


def gguf_file(name: str) -> Path:
    """A model as llama-server reads it: a .gguf file, or a model directory's model.gguf."""
    path = resolve_model(name)
    if path.is_dir() and (path / "model.gguf").is_file():
        return path / "model.gguf"
    if path.suffix != ".gguf":
        raise ValueError(f"llama-server needs a GGUF file; {path} is not one")
    return path


def paper_layout_args(mode: str, cpus: tuple[int, ...]) -> list[str]:
    """``saguaro serve``'s options for :func:`saguaro.config.paper_layout`."""
    fields = paper_layout(mode, cpus).items()
    return [arg for name, value in fields for arg in (flag(name), show(value))]


def saguaro_spec(mode: str, launch: Launch) -> EngineSpec:
    argv = [sys.executable, "-m", "saguaro.cli", "serve", "--model", launch.model]
    if mode != "ar":
        argv += ["--draft", launch.draft, "--k", str(launch.k)]
    argv += [
        "--mode",
        mode,
        "--max-num-seqs",
        str(launch.slots),
        "--max-model-len",
        str(launch.context_per_slot),
        "--host",
        HOST,
        *(paper_layout_args(mode, launch.cpus) if launch.layout == "paper" else ()),
        *launch.saguaro_args,
    ]
    return EngineSpec(f"saguaro {mode}", "saguaro", tuple(argv))


def llama_spec(with_draft: bool, launch: Launch) -> EngineSpec:
    threads = str(launch.llama_threads())
    argv = [launch.llama_server, "-m", str(gguf_file(launch.model))]
    argv += ["-np", str(launch.slots), "-c", str(launch.slots * launch.context_per_slot)]
    argv += ["-t", threads, "-tb", threads, "--metrics", "--no-webui", "--host", HOST]
    if with_draft:
        argv += ["-md", str(gguf_file(launch.draft)), "--spec-type", "draft-simple"]
        argv += ["--spec-draft-n-max", str(launch.k), "-td", threads, "-tbd", threads]
    argv += launch.llama_args
    return EngineSpec(LLAMA_SD if with_draft else LLAMA_AR, "llama", tuple(argv))


def engine_spec(name: str, launch: Launch) -> EngineSpec:
    if name in SAGUARO_ENGINES:
        return saguaro_spec(name, launch)
    if name in (LLAMA_AR, LLAMA_SD):
        return llama_spec(name == LLAMA_SD, launch)
    raise ValueError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")


def free_port() -> int:
    """A port free now (the server binds it a moment later: a race only another process
    binding ports in between could lose)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def pinned(argv: list[str], cpus: tuple[int, ...]) -> list[str]:
    """``argv`` run on ``cpus`` alone (its children inherit the mask)."""
    if not cpus:
        return argv
    if shutil.which("taskset") is None:
        raise RuntimeError("pinning servers to cores needs taskset (util-linux)")
    return ["taskset", "-c", ",".join(map(str, cpus)), *argv]


@dataclass
class Server:
    """A started server: its process, address and log."""

    spec: EngineSpec
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    model_id: str = ""
    startup_s: float = 0.0
    argv: list[str] = field(default_factory=list)

    def metrics_text(self) -> str:
        """The server's Prometheus exposition; RuntimeError if it cannot be read (a server that
        died mid-run)."""
        try:
            r = httpx.get(f"{self.url}/metrics", timeout=PROBE_TIMEOUT_S)
            r.raise_for_status()
        except httpx.HTTPError as e:
            raise RuntimeError(f"{self.spec.name}: cannot read /metrics: {e}") from e
        return r.text


def _log_tail(log: Path) -> str:
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    return ""


def _probe(url: str) -> str | None:
    """The served model's id once the server answers /health with 200 and lists it; else
    None."""
    try:
        if httpx.get(f"{url}/health", timeout=PROBE_TIMEOUT_S).status_code != httpx.codes.OK:
            return None
        models = httpx.get(f"{url}/v1/models", timeout=PROBE_TIMEOUT_S)
        return str(models.json()["data"][0]["id"]) if models.status_code == httpx.codes.OK else None
    except (httpx.HTTPError, KeyError, IndexError, ValueError):
        return None


def wait_ready(server: Server, timeout_s: float) -> None:
    """Block until ``server`` answers, or raise with its log's tail when it exits or the time
    runs out."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.spec.name} exited with {server.proc.returncode} before it answered; "
                f"its log ({server.log}) ends:\n{_log_tail(server.log)}"
            )
        model_id = _probe(server.url)
        if model_id is not None:
            server.model_id = model_id
            server.startup_s = time.perf_counter() - start
            return
        time.sleep(READY_POLL_S)
    raise TimeoutError(
        f"{server.spec.name} did not answer within {timeout_s:g} s; its log ({server.log}) "
        f"ends:\n{_log_tail(server.log)}"
    )


def stop(server: Server) -> None:
    """SIGTERM (saguaro drains and closes its draft worker), then SIGKILL to the process group
    this benchmark started if it is still there after the grace period."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
    with contextlib.suppress(ProcessLookupError):  # a child left behind by the server
        os.killpg(server.proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def running(
    spec: EngineSpec, cpus: tuple[int, ...], log_dir: Path, timeout_s: float, tag: str = ""
) -> Iterator[Server]:
    """``spec``'s server on a free port, pinned to ``cpus``, ready to answer; stopped on exit.
    Its output goes to ``log_dir``, in a file named after the engine and ``tag``."""
    port = free_port()
    argv = pinned([*spec.argv, "--port", str(port)], cpus)
    log_dir.mkdir(parents=True, exist_ok=True)
    name = (spec.name + tag).replace(" ", "-").replace("/", "_").replace("#", "")
    log = log_dir / (name + ".log")
    with open(log, "wb") as sink:
        # A session of its own: the server and any worker it spawns stop together.
        proc = subprocess.Popen(
            argv, stdout=sink, stderr=subprocess.STDOUT, env=spec.env(), start_new_session=True
        )
    server = Server(spec, proc, f"http://{HOST}:{port}", log, argv=argv)
    try:
        wait_ready(server, timeout_s)
        yield server
    finally:
        stop(server)
