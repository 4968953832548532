"""Diagnosis: host config reader, pure rules (path, host, fabric), the ranking engine and the
``diagnose`` orchestration that turns measurements into a report."""
