"""The site-wide views of routerproject/views.py that are not pages: the icon."""

from __future__ import annotations

from django.test import Client

from routerproject import views


def test_the_icon_is_an_ico_cached_for_a_day_and_needs_no_key(client: Client) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/x-icon"
    assert response["Cache-Control"] == f"public, max-age={views.FAVICON_MAX_AGE_SECS}"
    assert views.FAVICON_MAX_AGE_SECS == 86400
    # An ICO directory (reserved 0, type 1, one image) whose image is a 32 px PNG.
    assert response.content[:6] == b"\x00\x00\x01\x00\x01\x00"
    assert response.content[6:8] == b"\x20\x20"
    assert response.content[22:26] == b"\x89PNG"
