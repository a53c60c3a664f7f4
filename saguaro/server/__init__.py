"""Serving saguaro: an OpenAI-compatible HTTP server and a terminal chat.

- ``saguaro.server.routes``: ``build_app(llm, api_key=None, served_model_name=None)`` (FastAPI):
  the route handlers and their middleware; needs the ``serve`` extra.
- ``saguaro.server.protocol``: the request and response bodies, and a request's SamplingParams.
- ``saguaro.server.errors``: OpenAI-shaped error bodies and the app's exception handlers.
- ``saguaro.server.metrics``: ``/metrics`` in the Prometheus text format.
- ``saguaro.server.main``: ``serve_main(argv)``, the ``saguaro serve`` command (``ServerConfig``,
  the draining uvicorn server).
- ``saguaro.server.async_engine``: runs the engine loop on one background thread for asyncio.
- ``saguaro.server.chat``: chat prompts and ``chat_main(argv)``, the ``saguaro chat`` command.

Nothing is imported here, so ``saguaro chat`` works without the ``serve`` extra installed.
"""
