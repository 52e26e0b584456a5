"""The image and video families end to end: OpenAI edits and variations, sdapi img2img and
options, sd.cpp jobs and ComfyUI, on a standalone node and through a master to its slaves."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import (
    Cluster,
    ModelSpec,
    RouterNode,
    running_node,
    sim_weights,
    start_cluster,
    start_node,
    text_model,
    wait_for,
)

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG"


def painter(name: str, ms_per_step: int = 1) -> ModelSpec:
    return ModelSpec(
        name, {}, {"sdmodel": sim_weights(base_ms=5, image_ms_per_megapixel_step=ms_per_step)}
    )


def small(**extra: Any) -> dict[str, Any]:
    return {"prompt": "a cat", "width": 64, "height": 64, "steps": 2, **extra}


def form(model: str | None) -> dict[str, Any]:
    data = {"prompt": "a hat", "size": "64x64"}
    if model is not None:
        data["model"] = model
    return {"data": data, "files": {"image": ("in.png", PNG_MAGIC + b"rest", "image/png")}}


def workflow(ckpt_name: str) -> dict[str, Any]:
    return {
        "client_id": "test",
        "prompt": {
            "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt_name}},
            "3": {"class_type": "KSampler", "inputs": {"steps": 2, "model": ["4", 0]}},
        },
    }


def image_ids(client: httpx.Client) -> list[str]:
    return [m["title"] for m in client.get("/sdapi/v1/sd-models").json()]


def image_backend_seen(client: httpx.Client, node_id: str | None = None) -> list[dict[str, Any]]:
    """What the node's image backend was asked, oldest first (the sim's own record)."""
    params = {"node_id": node_id} if node_id else {}
    state = client.get("/router/v1/site/nodes/state", params=params).json()
    backend = next(b for b in state["backends"] if b["id"] == "image-runtime")
    requests: list[dict[str, Any]] = httpx.get(backend["base_url"] + "/sim/stats").json()[
        "requests"
    ]
    return requests


def finished_job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        resp = client.get(f"/sdcpp/v1/jobs/{job_id}")
        assert resp.status_code == 200, resp.text
        doc: dict[str, Any] = resp.json()
        return doc if doc["status"] == "completed" else None

    found: dict[str, Any] = wait_for(done)
    return found


def finished_prompt(client: httpx.Client, prompt_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        resp = client.get(f"/history/{prompt_id}")
        assert resp.status_code == 200, resp.text
        doc: dict[str, Any] = resp.json()
        return doc.get(prompt_id)

    found: dict[str, Any] = wait_for(done)
    return found


# -- one standalone node -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    root = tmp_path_factory.mktemp("media")
    n = start_node(root, [painter("pic"), painter("art", 2), text_model("chat")])
    try:
        yield n
    finally:
        n.cleanup()


@pytest.fixture
def client(node: RouterNode) -> Iterator[httpx.Client]:
    with node.client() as c:
        yield c


@pytest.fixture(scope="module")
def ids(node: RouterNode) -> tuple[str, str]:
    with node.client() as c:
        found = image_ids(c)
    pic = next(i for i in found if i.startswith("pic"))
    art = next(i for i in found if i.startswith("art"))
    return pic, art


def test_edits_and_variations_take_the_model_from_their_form(
    client: httpx.Client, ids: tuple[str, str]
) -> None:
    pic, _ = ids
    for path in ("/v1/images/edits", "/v1/images/variations"):
        resp = client.post(path, **form(pic))
        assert resp.status_code == 200, resp.text
        assert resp.json()["data"][0]["b64_json"]
        seen = image_backend_seen(client)[-1]
        assert seen == {"model": pic, "path": path, "duration_ms": seen["duration_ms"]}


def test_an_edit_naming_no_model_is_refused_before_any_backend(
    client: httpx.Client, ids: tuple[str, str]
) -> None:
    client.post("/v1/images/edits", **form(ids[0])).raise_for_status()
    before = len(image_backend_seen(client))
    resp = client.post("/v1/images/edits", **form(None))
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "model"
    missing = client.post("/v1/images/edits", **form("nope"))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert len(image_backend_seen(client)) == before


def test_img2img_runs_like_txt2img(client: httpx.Client, ids: tuple[str, str]) -> None:
    resp = client.post("/sdapi/v1/img2img", json=small(model=ids[1], init_images=["x"]))
    assert resp.status_code == 200, resp.text
    assert resp.json()["images"]
    assert image_backend_seen(client)[-1]["model"] == ids[1]


def test_refresh_checkpoints_is_answered_here(client: httpx.Client) -> None:
    resp = client.post("/sdapi/v1/refresh-checkpoints")
    assert resp.status_code == 200 and resp.json() == {}


def test_an_sdcpp_job_is_pending_then_completed(client: httpx.Client, ids: tuple[str, str]) -> None:
    pic, _ = ids
    # Long enough to be seen pending: 64x64 at 2 ms per megapixel-step is nothing, so steps.
    resp = client.post("/sdcpp/v1/img_gen", json=small(model=pic, steps=30_000))
    assert resp.status_code == 200, resp.text
    job = resp.json()
    assert job["status"] == "pending" and job["model"] == pic
    first = client.get(f"/sdcpp/v1/jobs/{job['id']}").json()
    assert first["status"] == "pending"
    done = finished_job(client, job["id"])
    assert done["result"]["images"] and done["model"] == pic
    video = client.post("/sdcpp/v1/vid_gen", json=small(model=pic, video_frames=3))
    assert video.status_code == 200, video.text
    assert finished_job(client, video.json()["id"])["object"] == "video.job"
    # The submit's few milliseconds are not the job's time: no image work for the cost fits.
    rows = client.get("/router/v1/site/analytics", params={"kind": "requests"}).json()["records"]
    submits = [r for r in rows if r["path"] in ("/sdcpp/v1/img_gen", "/sdcpp/v1/vid_gen")]
    assert submits and all(r["image_steps"] == 0 for r in submits)
    bad = client.post("/sdcpp/v1/img_gen", json=small(model=pic, size="huge"))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "size"


def test_an_unknown_job_goes_to_the_default_model_which_does_not_know_it(
    client: httpx.Client,
) -> None:
    resp = client.get("/sdcpp/v1/jobs/not-a-job")
    assert resp.status_code == 404
    assert resp.json()["error"]["message"] == "job not found"


def test_a_comfyui_workflow_runs_on_its_checkpoint_and_its_output_is_served(
    client: httpx.Client, ids: tuple[str, str]
) -> None:
    _, art = ids
    info = client.get("/object_info")
    assert info.status_code == 200 and "CheckpointLoaderSimple" in info.json()
    assert client.get("/system_stats").json()["devices"]
    resp = client.post("/prompt", json=workflow(f"{art}.safetensors"))
    assert resp.status_code == 200, resp.text
    prompt_id = resp.json()["prompt_id"]
    entry = finished_prompt(client, prompt_id)
    assert image_backend_seen(client)[-1]["loads"] == f"{art}.safetensors"
    image = entry["outputs"]["9"]["images"][0]
    view = client.get("/view", params={"filename": image["filename"], "type": "output"})
    assert view.status_code == 200 and view.content.startswith(PNG_MAGIC)
    # Model-less paths go to the default image model: the first by ID, with none selected.
    assert art < ids[0]
    assert client.get("/queue").json() == {"queue_running": [], "queue_pending": []}
    assert prompt_id in client.get("/history").json()
    assert client.post("/interrupt", json={}).status_code == 200
    upload = client.post("/upload/image", files={"image": ("a.png", PNG_MAGIC, "image/png")})
    assert upload.status_code == 200 and upload.json()["type"] == "input"


def test_a_diffusion_model_loader_names_the_model_too(
    client: httpx.Client, ids: tuple[str, str]
) -> None:
    pic, _ = ids
    flux = workflow(pic)
    flux["prompt"]["4"] = {"class_type": "UNETLoader", "inputs": {"unet_name": f"{pic}.gguf"}}
    resp = client.post("/prompt", json=flux)
    assert resp.status_code == 200, resp.text
    finished_prompt(client, resp.json()["prompt_id"])
    assert image_backend_seen(client)[-1]["loads"] == f"{pic}.gguf"


def test_a_workflow_naming_an_unknown_checkpoint_or_two_is_refused(
    client: httpx.Client, ids: tuple[str, str]
) -> None:
    resp = client.post("/prompt", json=workflow("missing.safetensors"))
    assert resp.status_code == 404
    assert resp.json()["error"]["param"] == "prompt"
    assert client.post("/prompt", json={"prompt": "x"}).status_code == 400
    pic, art = ids
    two = workflow(pic)
    two["prompt"]["5"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": art}}
    resp = client.post("/prompt", json=two)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"


def test_options_select_the_model_sdapi_requests_without_one_run_on(tmp_path: Path) -> None:
    # A node of its own: the selection stays for the node's life, and other tests need none.
    with (
        running_node(tmp_path, [painter("pic"), painter("art", 2)]) as fresh,
        fresh.client() as client,
    ):
        pic = next(i for i in image_ids(client) if i.startswith("pic"))
        art = next(i for i in image_ids(client) if i.startswith("art"))
        # Two image models and nothing selected: a generation must name its model.
        refused = client.post("/sdapi/v1/txt2img", json=small())
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"
        loose = client.post("/prompt", json={"prompt": {"3": {"inputs": {"steps": 2}}}})
        assert loose.status_code == 400 and loose.json()["error"]["param"] == "model"
        unknown = client.post("/sdapi/v1/options", json={"sd_model_checkpoint": "nope"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["param"] == "sd_model_checkpoint"
        assert client.post("/sdapi/v1/txt2img", json=small()).status_code == 400
        for chosen in (art, pic):
            resp = client.post("/sdapi/v1/options", json={"sd_model_checkpoint": chosen})
            assert resp.status_code == 200, resp.text
            assert client.get("/sdapi/v1/options").json()["sd_model_checkpoint"] == chosen
            ran = client.post("/sdapi/v1/txt2img", json=small())
            assert ran.status_code == 200, ran.text
            assert image_backend_seen(client)[-1]["model"] == chosen
            job = client.post("/sdcpp/v1/img_gen", json=small()).json()
            assert job["model"] == chosen
            prompt = client.post("/prompt", json={"prompt": {"3": {"inputs": {"steps": 2}}}})
            assert prompt.status_code == 200, prompt.text
            finished_prompt(client, prompt.json()["prompt_id"])
            assert image_backend_seen(client)[-1]["model"] == chosen


# -- a master and two slaves with the same image model -----------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("media-cluster")
    # `pic` is the same on both slaves (replicas); `paint` differs (one of them is suffixed).
    c = start_cluster(
        root,
        [text_model("chat")],
        {"s1": [painter("pic"), painter("paint", 1)], "s2": [painter("pic"), painter("paint", 2)]},
    )
    try:
        yield c
    finally:
        c.cleanup()


@pytest.fixture
def master(cluster: Cluster) -> Iterator[httpx.Client]:
    with cluster.master.client() as c:
        yield c


def image_records(master: httpx.Client) -> list[dict[str, Any]]:
    return [r for r in master.get("/router/v1/models").json()["models"] if r.get("image_id")]


def pic_id(master: httpx.Client) -> str:
    return next(r["public_image_id"] for r in image_records(master) if r["local_id"] == "pic")


def suffixed_paint(master: httpx.Client) -> tuple[str, str, str]:
    """(node, public image ID, served image ID) of the `paint` whose public ID is suffixed."""
    for rec in image_records(master):
        if rec["local_id"] == "paint" and rec["public_image_id"] != rec["image_id"]:
            return rec["node_id"], rec["public_image_id"], rec["image_id"]
    raise AssertionError("no suffixed paint model")


def test_sdcpp_jobs_are_polled_on_the_slave_that_runs_them(
    master: httpx.Client, cluster: Cluster
) -> None:
    pic = pic_id(master)
    jobs = []
    for _ in range(4):
        resp = master.post("/sdcpp/v1/img_gen", json=small(model=pic))
        assert resp.status_code == 200, resp.text
        jobs.append(resp.json()["id"])
    # Each poll reaches the job's own backend (the other one answers 404 for it), however
    # often the client asks: rotation would send every other poll of one job elsewhere.
    for job_id in jobs:
        assert finished_job(master, job_id)["model"] == pic
        for _ in range(2):
            assert master.get(f"/sdcpp/v1/jobs/{job_id}").json()["status"] == "completed"
    # The submissions rotated over both replicas, so following mattered.
    for slave in ("s1", "s2"):
        assert any(s["path"] == "/sdcpp/v1/img_gen" for s in image_backend_seen(master, slave))


def test_comfyui_prompts_and_their_files_follow_their_slave(master: httpx.Client) -> None:
    pic = pic_id(master)
    prompts = []
    for _ in range(4):
        resp = master.post("/prompt", json=workflow(pic))
        assert resp.status_code == 200, resp.text
        prompts.append(resp.json()["prompt_id"])
    for prompt_id in prompts:
        entry = finished_prompt(master, prompt_id)
        filename = entry["outputs"]["9"]["images"][0]["filename"]
        view = master.get("/view", params={"filename": filename})
        assert view.status_code == 200 and view.content.startswith(PNG_MAGIC)


def test_a_suffixed_model_is_named_by_its_served_id_on_the_slave_and_back(
    master: httpx.Client,
) -> None:
    node_id, public, served = suffixed_paint(master)
    job = master.post("/sdcpp/v1/img_gen", json=small(model=public))
    assert job.status_code == 200, job.text
    assert job.json()["model"] == public
    # The sim records a job when it completes, not when it is submitted.
    assert finished_job(master, job.json()["id"])["model"] == public
    assert image_backend_seen(master, node_id)[-1]["model"] == served
    edit = master.post("/v1/images/edits", **form(public))
    assert edit.status_code == 200, edit.text
    assert image_backend_seen(master, node_id)[-1]["model"] == served
    prompt = master.post("/prompt", json=workflow(f"{public}.safetensors"))
    assert prompt.status_code == 200, prompt.text
    finished_prompt(master, prompt.json()["prompt_id"])
    assert image_backend_seen(master, node_id)[-1]["loads"] == f"{served}.safetensors"
    img2img = master.post("/sdapi/v1/img2img", json=small(sd_model_checkpoint=public))
    assert img2img.status_code == 200, img2img.text
    assert image_backend_seen(master, node_id)[-1]["model"] == served


def test_options_through_the_master_select_a_slaves_model_under_its_public_id(
    master: httpx.Client, cluster: Cluster
) -> None:
    node_id, public, served = suffixed_paint(master)
    resp = master.post("/sdapi/v1/options", json={"sd_model_checkpoint": public})
    assert resp.status_code == 200, resp.text
    assert image_backend_seen(master, node_id)[-1]["model"] == served
    assert master.get("/sdapi/v1/options").json()["sd_model_checkpoint"] == public
    job = master.post("/sdcpp/v1/img_gen", json=small())
    assert job.status_code == 200, job.text
    assert job.json()["model"] == public
    # The slave's own default is another model now; a model-less request the master chose
    # the model for still names it to the slave.
    with cluster.slaves[node_id].client() as slave:
        own = next(i for i in image_ids(slave) if i.startswith("pic"))
        slave.post("/sdapi/v1/options", json={"sd_model_checkpoint": own}).raise_for_status()
        assert slave.get("/system_stats").json()["devices"][0]["name"] == "sim:pic"
    assert master.get("/system_stats").json()["devices"][0]["name"] == "sim:paint"
