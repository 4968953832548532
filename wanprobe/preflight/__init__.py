"""wanprobe preflight: can a job's hosts talk to each other well enough now, and with which NCCL settings."""
