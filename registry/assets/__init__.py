"""Model assets: the hash index, portable configs, resolution and verified peer transfers."""
