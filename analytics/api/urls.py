"""Analytics' routes under /router/v1/."""

from __future__ import annotations

from django.urls import path

from analytics.api import views

urlpatterns = [
    path("site/analytics", views.AnalyticsView.as_view(), name="site-analytics"),
    path("site/usage", views.UsageView.as_view(), name="site-usage"),
]
