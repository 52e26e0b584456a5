"""Lending's routes under /router/v1/."""

from __future__ import annotations

from django.urls import path

from lending.api import audit, impact, views

urlpatterns = [
    path("site/routing-groups", views.ImageLinksView.as_view(), name="site-routing-groups"),
    path(
        "site/text-routing-groups", views.TextLinksView.as_view(), name="site-text-routing-groups"
    ),
    path("site/offload/settings", views.SettingsView.as_view(), name="site-offload-settings"),
    path("site/offload/decisions", views.DecisionsView.as_view(), name="site-offload-decisions"),
    path(
        "site/offload/decisions/folded",
        views.DecisionFoldsView.as_view(),
        name="site-offload-decision-folds",
    ),
    path("site/offload/timeline", views.TimelineView.as_view(), name="site-offload-timeline"),
    path("site/offload/summary", views.SummaryView.as_view(), name="site-offload-summary"),
    path("site/offload/impact", impact.ImpactView.as_view(), name="site-offload-impact"),
    path("site/audit", audit.AuditView.as_view(), name="site-audit"),
]
