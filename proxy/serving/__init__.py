"""The serving core every family stands on: serve on a replica, fail over once, and the IDs a
backend handed out with the replica that holds them."""
