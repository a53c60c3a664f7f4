"""``saguaro serve``: serve a model over HTTP with uvicorn until a signal stops it.

The first SIGTERM / SIGINT drains (new requests get 503, those in flight get
``ServerConfig.shutdown_grace_s`` to finish, the rest end with finish_reason "abort"); a second
one stops at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

import uvicorn

from saguaro.launch import build_llm, engine_options
from saguaro.options import OptionParser, add_options, from_args, opt
from saguaro.server.async_engine import AsyncEngine
from saguaro.server.routes import build_app

API_KEY_ENV = "SAGUARO_API_KEY"
# After draining, how long uvicorn waits for open connections to close before dropping them.
CONNECTION_CLOSE_TIMEOUT_S = 5
# A process ended by signal N exits with 128 + N, as shells report it.
SIGNAL_EXIT_BASE = 128


def _api_key_from_env() -> str | None:
    return os.environ.get(API_KEY_ENV)


@dataclass
class ServerConfig:
    """How ``saguaro serve`` listens and shuts down (the engine's settings are EngineConfig's)."""

    host: str = opt("127.0.0.1", "bind address (0.0.0.0: every interface)")
    port: int = opt(8000, "TCP port to listen on")
    api_key: str | None = opt(
        help="require 'Authorization: Bearer KEY' on every endpoint but /health "
        f"(default: ${API_KEY_ENV}; unset: no auth)",
        default_factory=_api_key_from_env,
    )
    served_model_name: str | None = opt(None, "model id clients use (default: dir name)")
    max_waiting: int = opt(
        256,
        "requests that may wait for a place in the running batch (beyond max_num_seqs); more "
        "get 429 with Retry-After, and memory stays bounded",
    )
    shutdown_grace_s: float = opt(
        10.0,
        "on SIGTERM / SIGINT, how long requests in flight may take to finish before they are "
        "ended (a second signal stops at once)",
    )

    def __post_init__(self) -> None:
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")


def serve_parser() -> OptionParser:
    """``saguaro serve``'s options: EngineConfig's, then ServerConfig's."""
    parser = OptionParser(
        prog="saguaro serve", description="Serve a model over an OpenAI-compatible HTTP API."
    )
    engine_options(parser)
    add_options(parser, ServerConfig, group="server")
    # A server's memory is its steady state: resident from the start, flat while it serves. Its
    # load varies: sd and ssd step as AR where the batch makes their speculation a loss.
    parser.set_defaults(kv_prefault=True, ar_fallback=True)
    return parser


def serve_main(argv: list[str] | None = None) -> int:
    """``saguaro serve [--model DIR] [--draft DIR] [--mode M] [--k K] [--host H] [--port N]
    [--api-key KEY] [--max-model-len N] ...``: serve until interrupted."""
    args = serve_parser().parse_args(argv)
    cfg: ServerConfig = from_args(ServerConfig, args)
    llm = build_llm(args)
    print(f"saguaro serve: {llm.engine.kv_report}", file=sys.stderr, flush=True)
    # uvicorn re-raises the signal that stopped it once it is done; SIGTERM's default action
    # would then end the process before the engine (and its draft worker) is closed.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with llm:
        app = build_app(llm, cfg.api_key, cfg.served_model_name, cfg.max_waiting)
        config = uvicorn.Config(
            app,
            host=cfg.host,
            port=cfg.port,
            timeout_graceful_shutdown=CONNECTION_CLOSE_TIMEOUT_S,
        )
        DrainingServer(config, app.state.async_engine, cfg.shutdown_grace_s).run()
    return 0


def _exit_on_sigterm(sig: int, _frame: object) -> None:
    raise SystemExit(SIGNAL_EXIT_BASE + sig)


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM / SIGINT drains before it stops: new requests get
    503, those in flight have ``grace_s`` seconds to finish, the rest end with a final chunk
    (finish_reason "abort"); then uvicorn shuts down as usual. A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, ae: AsyncEngine, grace_s: float) -> None:
        super().__init__(config)
        self.ae = ae
        self.grace_s = grace_s
        self.draining = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.draining:
            return super().handle_exit(sig, frame)
        self.draining = True
        # Draining blocks until the requests finish: off the event loop, which serves them.
        threading.Thread(
            target=self._drain_then_exit, args=(sig, frame), name="saguaro-drain", daemon=True
        ).start()

    def _drain_then_exit(self, sig: int, frame: Any) -> None:
        self.ae.drain(self.grace_s)
        super().handle_exit(sig, frame)
