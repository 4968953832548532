"""The bounded HTTP listener (``server.py``), its TLS and basic auth from an exporter-toolkit web
config (``web_config.py``, ``auth.py``); the daemon's metrics and pages add routes to it."""
