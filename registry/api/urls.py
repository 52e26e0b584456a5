"""The registry's routes under /router/v1/."""

from __future__ import annotations

from django.urls import path

from registry.api import assets, benchmarks, cook, views

urlpatterns = [
    path("models", views.ModelsView.as_view(), name="router-models"),
    path("load", views.LoadView.as_view(), name="router-load"),
    path("unload", views.UnloadView.as_view(), name="router-unload"),
    path("version", views.VersionView.as_view(), name="router-version"),
    path("benchmarks", benchmarks.BenchmarksView.as_view(), name="router-benchmarks"),
    path("benchmarks/run", benchmarks.BenchmarkRunView.as_view(), name="router-benchmarks-run"),
    path("site/nodes/state", views.NodesStateView.as_view(), name="site-nodes-state"),
    path("site/nodes/unload", views.NodesUnloadView.as_view(), name="site-nodes-unload"),
    path("site/models/state", views.ModelStateView.as_view(), name="site-models-state"),
    path("site/inventory", views.InventoryView.as_view(), name="site-inventory"),
    path("site/model-assets/export", assets.ExportView.as_view(), name="site-assets-export"),
    path("site/model-assets/resolve", assets.ResolveView.as_view(), name="site-assets-resolve"),
    path(
        "site/model-assets/resolve-batch",
        assets.ResolveBatchView.as_view(),
        name="site-assets-resolve-batch",
    ),
    path("site/cook/preview", cook.CookPreviewView.as_view(), name="site-cook-preview"),
    path("site/cook/apply", cook.CookApplyView.as_view(), name="site-cook-apply"),
    path("site/cook/<str:recipe_id>", cook.CookDeleteView.as_view(), name="site-cook-delete"),
    path("site/model-assets/bind", assets.BindView.as_view(), name="site-assets-bind"),
    path(
        "site/model-assets/substitute",
        assets.SubstituteView.as_view(),
        name="site-assets-substitute",
    ),
    path("site/model-assets/jobs", assets.JobsView.as_view(), name="site-assets-jobs"),
    path("site/model-assets/jobs/<str:job_id>", assets.JobView.as_view(), name="site-assets-job"),
    # After every fixed name above: a hash is the only other single segment served here.
    path(
        "site/model-assets/<str:sha256>",
        assets.AssetLookupView.as_view(),
        name="site-assets-lookup",
    ),
]
