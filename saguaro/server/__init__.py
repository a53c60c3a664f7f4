"""Serving saguaro: an OpenAI-compatible HTTP server and a terminal chat.

- ``saguaro.server.app``: ``build_app(llm, api_key=None, served_model_name=None)`` (FastAPI) and
  ``serve_main(argv)``, the ``saguaro serve`` command; needs the ``serve`` extra.
- ``saguaro.server.async_engine``: runs the engine loop on one background thread for asyncio.
- ``saguaro.server.chat``: chat prompts and ``chat_main(argv)``, the ``saguaro chat`` command.

Nothing is imported here, so ``saguaro chat`` works without the ``serve`` extra installed.
"""
