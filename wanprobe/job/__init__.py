"""The training job's side: a step recorder for the job (``recorder.py``, no dependency), its
step log read back (``steps.py``), and slow steps explained by path and host events
(``explain.py``, pure)."""
