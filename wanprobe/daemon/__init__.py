"""The wanprobe daemon: continuous mesh probing under systemd, a durable history in SQLite,
Prometheus metrics and ticket-ready regression reports. ``main.run`` is the composition root."""
