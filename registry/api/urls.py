from __future__ import annotations

from django.urls import path

from analytics.api import views as analytics_views
from lending.api import links as link_views
from lending.api import summary as summary_views
from registry.api import inventory as inventory_views
from registry.api import schema as schema_views
from registry.api import views

urlpatterns = [
    path("models", views.models_list, name="router-models"),
    path("load", views.load, name="router-load"),
    path("unload", views.unload, name="router-unload"),
    path("version", views.version, name="router-version"),
    path("schema", schema_views.schema, name="router-schema"),
    path("site/nodes/state", views.nodes_state, name="site-nodes-state"),
    path("site/nodes/unload", views.nodes_unload, name="site-nodes-unload"),
    path("site/models/state", views.model_state, name="site-models-state"),
    path("site/inventory", inventory_views.site_inventory, name="site-inventory"),
    path("site/analytics", analytics_views.analytics, name="site-analytics"),
    path("site/routing-groups", link_views.routing_groups, name="site-routing-groups"),
    path(
        "site/text-routing-groups", link_views.text_routing_groups, name="site-text-routing-groups"
    ),
    path("site/offload/summary", summary_views.summary, name="site-offload-summary"),
]
