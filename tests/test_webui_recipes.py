"""The Recipes page in headless Chromium (Debian's build, driven by Playwright)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser import require_chromium
from tests.harness import Cluster, ModelSpec, sim_weights, start_cluster, text_model

pytestmark = pytest.mark.integration
require_chromium()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pics = ModelSpec("pics", {}, {"sdmodel": sim_weights(base_ms=5, image_ms_per_megapixel_step=1)})
    c = start_cluster(
        tmp_path_factory.mktemp("webui-recipes"), [], {"w1": [text_model("words")], "w2": [pics]}
    )
    try:
        yield c
    finally:
        c.cleanup()


def test_a_recipe_is_made_from_models_of_two_nodes_listed_and_deleted(
    cluster: Cluster, new_page: Callable[..., Any]
) -> None:
    store = cluster.master.store / "split-recipes.json"
    tab = new_page()
    tab.goto(cluster.master.base_url + "/ui/recipes")
    tab.wait_for_selector('select[data-kind="text"] option:nth-child(2)', state="attached")
    # The image list offers only models that make images.
    images = tab.locator('select[data-kind="image"] option').all_inner_texts()
    assert images == ["—", "pics on w2"]
    tab.fill("#rid", "combo")
    tab.select_option('select[data-kind="text"]', label="words on w1")
    tab.click("#apply")
    tab.wait_for_selector("#result .err")
    assert "components" in tab.inner_text("#result")  # one node only: refused
    assert not store.exists()

    tab.select_option('select[data-kind="image"]', label="pics on w2")
    tab.click("#apply")
    tab.wait_for_selector('tr[data-recipe="combo"]')
    row = tab.inner_text('tr[data-recipe="combo"]')
    assert "text: words on w1" in row and "image: pics on w2" in row
    assert [r["id"] for r in json.loads(store.read_text())["recipes"]] == ["combo"]

    tab.click('tr[data-recipe="combo"] button.delete')
    tab.wait_for_selector('tr[data-recipe="combo"]', state="detached")
    assert json.loads(store.read_text())["recipes"] == []
