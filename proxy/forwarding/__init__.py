"""Forwarding a request: to a local backend or to the node that holds its model, the fault
rules that decide a retry, what is in flight, and rewriting answers to the public model ID."""
