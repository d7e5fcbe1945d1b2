"""``tokenmix serve``: an OpenAI-compatible HTTP server with continuous batching over streaming states.

Needs the optional extra: ``pip install "tokenmix[serve]"`` (FastAPI, uvicorn, prometheus_client).
"""

ENGINE_PHASES = ("join", "decode", "prefill", "schedule")  # where the engine's iterations spend their time (``/metrics``)
