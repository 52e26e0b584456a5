"""`manage.py init_node`: a node's config written in one command.

`joining` the join string a master hands its slaves; `ggufscan` the models found in a
directory (GGUF headers, vision projectors); `render` the commented config and the model
configs written from them. The command (registry/management/commands/init_node.py) only
parses arguments, calls these and prints what the operator does next.
"""
