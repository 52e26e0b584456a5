"""The edge: the ASGI app, the front door and its rules, the client route table, the node
protocol, the realtime WebSocket and file sending."""
