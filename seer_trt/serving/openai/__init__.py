"""seer-serve's OpenAI-compatible HTTP server: the wire schema (``chat``), the chat route (``completions``), the app
(``http``), its bounds (``middleware``), its metrics (``metrics``) and its uvicorn lifecycle (``server``)."""
