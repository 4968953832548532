"""Tuners: read current, plan, apply, verify and roll back host network settings."""
