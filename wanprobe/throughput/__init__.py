"""Multi-stream TCP/UDP throughput tests that explain what limits the transfer."""
