"""ASGI entry point: the inference proxy in front of Django, under Channels' protocol router."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "routerproject.settings")

from channels.routing import ProtocolTypeRouter
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

# Static files (the admin's, Swagger UI's) come from the apps' static/ folders, found as
# `runserver` finds them: a node serves a handful of small files and needs no collectstatic.
django_app = ASGIStaticFilesHandler(get_asgi_application())

from proxy.edge.app import ProxyApp  # noqa: E402  (needs the app registry ready)
from proxy.edge.realtime import RealtimeApp  # noqa: E402

# WebSockets: only /v1/realtime (and its node route), relayed to the model's backend.
application = ProtocolTypeRouter({"http": ProxyApp(django_app), "websocket": RealtimeApp()})
