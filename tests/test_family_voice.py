"""The voice paths through a standalone node and through a master to a slave (real processes).

Speech (TTS) goes to models with a TTS model on the text lane; translations and Kobold's
transcribe are speech-to-text like /v1/audio/transcriptions (selector-less: §5.3).
"""

from __future__ import annotations

import base64
import io
import struct
import time
import wave
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.harness import (
    CLUSTER_TOKEN,
    Cluster,
    ModelSpec,
    RouterNode,
    running_node,
    sim_weights,
    start_cluster,
    text_model,
)

pytestmark = pytest.mark.integration

AUTH = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}
STREAM_GAP_MS = 4000


def speaker(name: str, **costs: Any) -> ModelSpec:
    """A text model with a TTS model beside it (KoboldCpp's `ttsmodel`)."""
    return ModelSpec(
        name,
        {"contextsize": 4096, "parallel": 1},
        {"model_param": sim_weights(**costs), "ttsmodel": sim_weights(**costs)},
    )


def ears(name: str) -> ModelSpec:
    return ModelSpec(name, {}, {"whispermodel": sim_weights(base_ms=5)})


def wav(seconds: float = 0.1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(struct.pack("<h", 0) * int(8000 * seconds))
    return buf.getvalue()


def audio_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as clip:
        return clip.getnframes() / clip.getframerate()


def text_backend(node: RouterNode) -> str:
    with node.client() as client:
        # A slave answers its state on the node route only.
        state = client.get("/router/v1/node/state", headers=AUTH).json()
        if "backends" not in state:
            state = client.get("/router/v1/site/nodes/state").json()
    backend = next(b for b in state["backends"] if b["id"] == "text-runtime")
    url: str = backend["base_url"]
    return url


def last_seen(node: RouterNode) -> dict[str, Any]:
    """What the node's text backend was last asked (path and model, as the sim records them)."""
    seen: dict[str, Any] = httpx.get(text_backend(node) + "/sim/stats").json()["requests"][-1]
    return seen


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterNode]:
    root = tmp_path_factory.mktemp("voice")
    with running_node(root, [speaker("speaker"), ears("ears"), text_model("plain")]) as started:
        yield started


@pytest.fixture(scope="module")
def client(node: RouterNode) -> Iterator[httpx.Client]:
    with node.client() as c:
        yield c


# -- standalone ----------------------------------------------------------------------------


def test_speech_answers_the_backends_wav_as_it_came(client: httpx.Client, node: RouterNode) -> None:
    resp = client.post("/v1/audio/speech", json={"model": "speaker", "input": "hello"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("audio/wav")
    assert audio_seconds(resp.content) > 0
    seen = last_seen(node)
    assert (seen["path"], seen["model"]) == ("/v1/audio/speech", "speaker")


def test_kobold_tts_and_speech_without_a_model_use_the_only_model_that_speaks(
    client: httpx.Client, node: RouterNode
) -> None:
    for path in ("/api/extra/tts", "/v1/audio/speech"):
        resp = client.post(path, json={"input": "hello", "voice": "kobold"})
        assert resp.status_code == 200, resp.text
        assert audio_seconds(resp.content) > 0
        seen = last_seen(node)
        # The choice is written into the body the backend reads.
        assert (seen["path"], seen["model"], seen["voice"]) == (path, "speaker", "kobold")


def test_speech_names_its_model_by_query_or_header_too(
    client: httpx.Client, node: RouterNode
) -> None:
    resp = client.post("/v1/audio/speech?model=speaker", json={"input": "hi"})
    assert resp.status_code == 200, resp.text
    resp = client.post(
        "/v1/audio/speech", json={"input": "hi"}, headers={"X-Tensors-Model": "speaker"}
    )
    assert resp.status_code == 200, resp.text
    assert last_seen(node)["model"] == "speaker"


@pytest.mark.parametrize(
    ("body", "status", "param", "says"),
    [
        ({"model": "speaker"}, 400, "input", "input is required"),
        ({"model": "speaker", "input": "  "}, 400, "input", "input is required"),
        ({"model": "plain", "input": "hi"}, 404, "model", "does not speak"),
        ({"model": "nope", "input": "hi"}, 404, "model", "was not found"),
        ({"model": 7, "input": "hi"}, 400, "model", "model must be a string"),
    ],
)
def test_bad_speech_requests_are_refused_naming_the_field(
    client: httpx.Client, body: dict[str, Any], status: int, param: str, says: str
) -> None:
    resp = client.post("/v1/audio/speech", json=body)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and says in error["message"]


def test_speech_with_a_body_that_is_no_json_object_is_400(client: httpx.Client) -> None:
    resp = client.post(
        "/api/extra/tts", content=b"[1]", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    assert "JSON object" in resp.json()["error"]["message"]


def test_voices_come_from_the_speech_models_backend(client: httpx.Client) -> None:
    for path in ("/v1/audio/voices?model=speaker", "/audio/voices"):
        resp = client.get(path)
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"model": "speaker", "voices": ["alloy", "echo", "kobold"]}
    assert client.get("/v1/audio/voices?model=plain").status_code == 404
    assert client.post("/v1/audio/voices").status_code == 405


def test_translations_with_and_without_a_model(client: httpx.Client) -> None:
    files = {"file": ("a.wav", wav(), "audio/wav")}
    resp = client.post("/v1/audio/translations", files=files, data={"model": "ears"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["text"]
    resp = client.post("/v1/audio/translations", files=files)
    assert resp.status_code == 200, resp.text
    mp3 = {"file": ("a.mp3", b"ID3\x03\x00\x00\x00", "audio/mpeg")}
    resp = client.post("/v1/audio/translations", files=mp3, data={"model": "ears"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "file"


def test_kobold_transcribe_takes_base64_wav_with_or_without_a_model(client: httpx.Client) -> None:
    audio = base64.b64encode(wav()).decode()
    resp = client.post("/api/extra/transcribe", json={"audio_data": audio, "model": "ears"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["text"]
    resp = client.post(
        "/api/extra/transcribe", json={"audio_data": "data:audio/wav;base64," + audio}
    )
    assert resp.status_code == 200, resp.text


@pytest.mark.parametrize(
    ("audio", "says"),
    [
        (None, "audio_data is required"),
        ("not base64!", "not valid base64"),
        (base64.b64encode(b"ID3\x03\x00\x00\x00").decode(), "must be a WAV"),
    ],
)
def test_kobold_transcribe_refuses_what_is_not_a_wav(
    client: httpx.Client, audio: str | None, says: str
) -> None:
    resp = client.post("/api/extra/transcribe", json={"audio_data": audio, "model": "ears"})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "audio_data" and says in error["message"]


def test_kobold_version_says_tts_when_a_model_speaks(client: httpx.Client) -> None:
    version = client.get("/api/extra/version").json()
    assert version["tts"] is True and version["transcribe"] is True


def test_a_plain_get_on_the_realtime_socket_asks_for_the_upgrade(client: httpx.Client) -> None:
    resp = client.get("/v1/realtime?model=speaker")
    assert resp.status_code == 426
    assert resp.json()["error"]["code"] == "upgrade_required"


# -- master and slave ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("voice-cluster")
    # Different weights under one name: the slave's speaker is `speaker-2` on the master.
    c = start_cluster(
        root,
        [speaker("speaker", base_ms=5)],
        {
            "s1": [
                speaker("speaker", base_ms=7),
                ears("ears"),
                speaker("slow-speaker", base_ms=STREAM_GAP_MS),
                # Only a TTS model, which the README says is enough for a model that speaks.
                ModelSpec("voice-only", {}, {"ttsmodel": sim_weights(base_ms=5)}),
            ]
        },
    )
    try:
        yield c
    finally:
        c.cleanup()


def test_speech_reaches_the_slave_under_its_own_id(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        resp = client.post("/v1/audio/speech", json={"model": "speaker-2", "input": "hi"})
        assert resp.status_code == 200, resp.text
        assert audio_seconds(resp.content) > 0
        assert last_seen(cluster.slaves["s1"])["model"] == "speaker"
        resp = client.post(
            "/api/extra/tts", json={"input": "hi"}, headers={"X-Tensors-Model": "speaker-2"}
        )
        assert resp.status_code == 200, resp.text
        seen = last_seen(cluster.slaves["s1"])
        assert (seen["path"], seen["model"]) == ("/api/extra/tts", "speaker")


def test_streamed_speech_reaches_the_client_as_the_backend_makes_it(cluster: Cluster) -> None:
    # The slow speaker's backend sends half its WAV, then the rest STREAM_GAP_MS later: the
    # first half must arrive long before that (asked of the node that serves it).
    body = {"model": "slow-speaker", "input": "hello", "stream_format": "audio"}
    with cluster.slaves["s1"].client() as client:
        # Loaded first: the measured request must not wait for a model switch.
        client.post("/v1/audio/speech", json={"model": "slow-speaker", "input": "warm"})
    started = time.monotonic()
    with (
        cluster.slaves["s1"].client() as client,
        client.stream("POST", "/v1/audio/speech", json=body) as resp,
    ):
        assert resp.status_code == 200
        chunks = resp.iter_raw()
        first = next(chunks)
        assert time.monotonic() - started < STREAM_GAP_MS / 1000.0 / 2
        audio = first + b"".join(chunks)
    assert audio_seconds(audio) > 0


def test_a_config_with_only_a_tts_model_speaks(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        resp = client.post("/v1/audio/speech", json={"model": "voice-only", "input": "hi"})
        assert resp.status_code == 200, resp.text
        assert audio_seconds(resp.content) > 0
        seen = last_seen(cluster.slaves["s1"])
        assert (seen["path"], seen["model"]) == ("/v1/audio/speech", "voice-only")
        # It speaks and does nothing else: no chat, and no entry in the text model list.
        chat = client.post(
            "/v1/chat/completions",
            json={"model": "voice-only", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 404 and "does not generate text" in chat.text
        assert "voice-only" not in {m["id"] for m in client.get("/v1/models").json()["data"]}


def test_streamed_speech_through_the_master_reaches_the_client_as_the_backend_makes_it(
    cluster: Cluster,
) -> None:
    # As above, asked of the master: the slave's audio is relayed as it comes, not buffered.
    body = {"model": "slow-speaker", "input": "hello", "stream_format": "audio"}
    with cluster.master.client() as client:
        warm = client.post("/v1/audio/speech", json={"model": "slow-speaker", "input": "warm"})
        assert warm.status_code == 200, warm.text
    started = time.monotonic()
    with (
        cluster.master.client() as client,
        client.stream("POST", "/v1/audio/speech", json=body) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("audio/wav")
        chunks = resp.iter_raw()
        first = next(chunks)
        assert time.monotonic() - started < STREAM_GAP_MS / 1000.0 / 2
        audio = first + b"".join(chunks)
    assert audio_seconds(audio) > 0
    assert last_seen(cluster.slaves["s1"])["model"] == "slow-speaker"


def test_speech_without_a_model_among_two_speakers_is_refused(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        resp = client.post("/v1/audio/speech", json={"input": "hi"})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "model is required"


def test_voices_of_a_slaves_model_come_back_under_the_public_id(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        resp = client.get("/v1/audio/voices", params={"model": "speaker-2"})
        assert resp.status_code == 200, resp.text
        # The slave's backend was asked for `speaker`; the answer names `speaker-2`.
        assert resp.json()["model"] == "speaker-2"
        resp = client.get("/audio/voices", params={"model": "speaker"})
        assert resp.json()["model"] == "speaker"


def test_speech_to_text_goes_to_the_slave_that_hears(cluster: Cluster) -> None:
    files = {"file": ("a.wav", wav(), "audio/wav")}
    audio = base64.b64encode(wav()).decode()
    with cluster.master.client() as client:
        for data in ({"model": "ears"}, {}):
            resp = client.post("/v1/audio/translations", files=files, data=data)
            assert resp.status_code == 200, resp.text
            resp = client.post("/api/extra/transcribe", json={"audio_data": audio, **data})
            assert resp.status_code == 200, resp.text
            assert resp.json()["text"]


def test_speech_to_a_model_of_no_node_is_404_on_the_master(cluster: Cluster) -> None:
    with cluster.master.client() as client:
        resp = client.post("/api/extra/transcribe", json={"audio_data": "x", "model": "ears"})
        assert resp.status_code == 400  # bad audio is refused before any routing
        resp = client.post(
            "/api/extra/transcribe",
            json={"audio_data": base64.b64encode(wav()).decode(), "model": "nope"},
        )
        assert resp.status_code == 404
