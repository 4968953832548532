"""wanprobe: measure, diagnose and tune datacenter-to-datacenter links for distributed training."""

__version__ = "0.1.0"
