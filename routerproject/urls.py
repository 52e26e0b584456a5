from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from routerproject import views

urlpatterns = [
    path("admin/", admin.site.urls),
    # Each app serves its own management routes; dotted names keep this module free of imports
    # from the apps, so the layers stay one-way.
    path("router/v1/", include("registry.api.urls")),
    path("router/v1/", include("analytics.api.urls")),
    path("router/v1/", include("lending.api.urls")),
    path("router/v1/", include("guardians.api.urls")),
    path("router/v1/", include("proxy.api.urls")),
    path("router/v1/", include("access.api.urls")),
    path("ui/", include("lending.ui")),
    path("ui/", include("registry.ui")),
    path("ui/", include("analytics.ui")),
    path("ui/", include("access.webui")),
    path("ui/nodes", views.nodes_page, name="ui-nodes"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("", views.index, name="index"),
]

handler404 = "routerproject.views.not_found"
handler500 = "routerproject.views.server_error"
