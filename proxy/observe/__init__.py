"""Observation: Prometheus metrics, the access line and the health probes."""
