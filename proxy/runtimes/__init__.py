"""Backend runtimes and adapters: the processes a node runs, how each server family is started
and probed for readiness, and their log files."""
