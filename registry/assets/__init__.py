"""Model assets: the hash index, portable configs, resolution and verified peer transfers.

`store` holds this node's files (validity rules, shared dir, hash index); `partial` and `pull`
copy one asset from a peer or the hub, verified; `service` resolves portable configs, exports
and serves; `routes` and `substitute` are the routes' work.
"""
