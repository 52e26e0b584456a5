"""Backend adapters: the launch (command line, address, probe) of each family and lane."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.runtimes.backends import DEFAULT_BINARIES, LaunchError, build_launch, runtime_lane
from proxy.sim.config import parse_args
from registry.hashing import FileHasher
from registry.kcpps import ModelConfig, load_model_config
from routerproject.config import RouterConfig, load_config

PORT = 41234
SIM_WEIGHTS = {"load_ms": 10, "base_ms": 1}


class Layout:
    """A config dir beside a weights dir, as in demo/: configs refer to ../weights/…"""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.kcpps = root / "kcpps"
        self.weights = root / "weights"
        self.kcpps.mkdir()
        self.weights.mkdir()
        for name in ("chat", "image", "whisper", "embed", "proj"):
            (self.weights / f"{name}.sim.json").write_text(json.dumps(SIM_WEIGHTS))
            (self.weights / f"{name}.gguf").write_bytes(b"GGUF" + name.encode())

    def router_config(self, **sections: Any) -> RouterConfig:
        doc: dict[str, Any] = {
            "cluster": {"store_dir": str(self.root / "store")},
            "models": {"config_dir": str(self.kcpps)},
            "backend": {"mode": "llama_sdcpp"},
        }
        doc.update(sections)
        path = self.root / "config.yaml"
        path.write_text(yaml.safe_dump(doc))
        return load_config(path, environ={})

    def model(self, name: str, raw: dict[str, Any]) -> ModelConfig:
        path = self.kcpps / f"{name}.kcpps"
        path.write_text(json.dumps(raw))
        return load_model_config(path, default_backend_mode="llama_sdcpp", hasher=FileHasher(None))


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path)


def _w(name: str) -> str:
    return f"../weights/{name}"


def _after(argv: tuple[str, ...] | None, option: str) -> str:
    """The value of the last `option` (the sim's argv has `python -m proxy.sim -m WEIGHTS`)."""
    assert argv is not None
    index = len(argv) - 1 - argv[::-1].index(option)
    return argv[index + 1]


# -- sim --------------------------------------------------------------------------------


def test_a_sim_text_launch_runs_the_simulator_with_llama_server_options(layout: Layout) -> None:
    cfg = layout.model(
        "chat",
        {"backend_mode": "sim", "model_param": _w("chat.sim.json"), "contextsize": 2048},
    )
    launch = build_launch(cfg, "text", config=layout.router_config(), port=PORT)
    assert launch.argv is not None
    assert launch.argv[:3] == (sys.executable, "-m", "proxy.sim")
    assert _after(launch.argv, "-m") == str(layout.weights / "chat.sim.json")
    assert _after(launch.argv, "--port") == str(PORT)
    assert _after(launch.argv, "-a") == "chat"
    assert _after(launch.argv, "-c") == "2048"
    assert launch.base_url == f"http://127.0.0.1:{PORT}"
    assert (launch.probe, launch.family) == ("models", "sim")


def test_the_sim_reads_back_exactly_what_its_launch_says(layout: Layout) -> None:
    cfg = layout.model(
        "vision",
        {
            "backend_mode": "sim",
            "model_param": _w("chat.sim.json"),
            "mmproj": _w("proj.sim.json"),
            "contextsize": 1024,
        },
    )
    launch = build_launch(cfg, "text", config=layout.router_config(), port=PORT)
    assert launch.argv is not None
    parsed = parse_args(list(launch.argv[3:]))
    assert parsed.weights_path == str(layout.weights / "chat.sim.json")
    assert (parsed.host, parsed.port, parsed.alias) == ("127.0.0.1", PORT, "vision")
    assert parsed.ctx_size == 1024
    assert parsed.mmproj == str(layout.weights / "proj.sim.json")


@pytest.mark.parametrize(
    ("lane", "field", "weights", "probe"),
    [
        ("image", "sdmodel", "image.sim.json", "sd_models"),
        ("whisper", "whispermodel", "whisper.sim.json", "health"),
    ],
)
def test_a_sim_launch_probes_the_endpoint_of_its_lane(
    layout: Layout, lane: str, field: str, weights: str, probe: str
) -> None:
    cfg = layout.model("m", {"backend_mode": "sim", field: _w(weights)})
    launch = build_launch(cfg, lane, config=layout.router_config(), port=PORT)  # type: ignore[arg-type]
    assert _after(launch.argv, "-m") == str(layout.weights / weights)
    assert launch.probe == probe


def test_the_sim_listens_on_the_configured_backend_host(layout: Layout) -> None:
    cfg = layout.model("chat", {"backend_mode": "sim", "model_param": _w("chat.sim.json")})
    config = layout.router_config(backend={"mode": "sim", "host": "127.0.0.2"})
    launch = build_launch(cfg, "text", config=config, port=PORT)
    assert _after(launch.argv, "--host") == "127.0.0.2"
    assert launch.base_url == f"http://127.0.0.2:{PORT}"


# -- llama_sdcpp ------------------------------------------------------------------------


def test_a_llama_text_launch_carries_context_slots_projector_embeddings_and_extra_args(
    layout: Layout,
) -> None:
    cfg = layout.model(
        "chat",
        {
            "model_param": _w("chat.gguf"),
            "mmproj": _w("proj.gguf"),
            "contextsize": 8192,
            "parallel": 2,
            "embeddings": True,
        },
    )
    config = layout.router_config(
        llama={"binary_path": "/opt/llama/llama-server", "extra_args": ["-ngl", 99]}
    )
    launch = build_launch(cfg, "text", config=config, port=PORT)
    assert launch.argv == (
        "/opt/llama/llama-server",
        "-m",
        str(layout.weights / "chat.gguf"),
        "--host",
        "127.0.0.1",
        "--port",
        str(PORT),
        "--alias",
        "chat",
        "-c",
        "8192",
        "-np",
        "2",
        "--mmproj",
        str(layout.weights / "proj.gguf"),
        "--embeddings",
        "-ngl",
        "99",
    )
    assert (launch.probe, launch.family) == ("models", "llama")
    assert launch.base_url == f"http://127.0.0.1:{PORT}"


def test_a_configs_own_extra_args_follow_the_familys(layout: Layout) -> None:
    cfg = layout.model(
        "chat",
        {"model_param": _w("chat.gguf"), "extra_args": ["--embeddings", "--pooling", "mean"]},
    )
    config = layout.router_config(llama={"extra_args": ["-t", 1]})
    launch = build_launch(cfg, "text", config=config, port=PORT)
    assert launch.argv is not None
    assert launch.argv[-5:] == ("-t", "1", "--embeddings", "--pooling", "mean")


@pytest.mark.parametrize(
    ("mode", "field", "weights", "lane"),
    [
        ("sim", "model_param", "chat.sim.json", "text"),
        ("llama_sdcpp", "sdmodel", "image.sim.json", "image"),
        ("llama_sdcpp", "whispermodel", "whisper.sim.json", "whisper"),
        ("vllm", "model_param", "chat.gguf", "text"),
        ("kobold", "model_param", "chat.gguf", "text"),
    ],
)
def test_every_family_passes_a_configs_extra_args(
    layout: Layout, mode: str, field: str, weights: str, lane: str
) -> None:
    cfg = layout.model("m", {"backend_mode": mode, field: _w(weights), "extra_args": ["--x", 7]})
    launch = build_launch(cfg, lane, config=layout.router_config(), port=PORT)  # type: ignore[arg-type]
    assert launch.argv is not None and launch.argv[-2:] == ("--x", "7")


def test_the_sim_gets_the_slot_count_and_gates_on_one_slots_share(layout: Layout) -> None:
    cfg = layout.model(
        "chat",
        {
            "backend_mode": "sim",
            "model_param": _w("chat.sim.json"),
            "contextsize": 4096,
            "parallel": 2,
        },
    )
    launch = build_launch(cfg, "text", config=layout.router_config(), port=PORT)
    assert launch.argv is not None
    parsed = parse_args(list(launch.argv[3:]))
    assert (parsed.ctx_size, parsed.parallel) == (4096, 2)


def test_a_llama_launch_without_a_binary_path_runs_the_default_binary(layout: Layout) -> None:
    cfg = layout.model("chat", {"model_param": _w("chat.gguf")})
    launch = build_launch(cfg, "text", config=layout.router_config(), port=PORT)
    assert launch.argv is not None
    assert launch.argv[0] == DEFAULT_BINARIES["llama"] == "llama-server"
    assert "-c" not in launch.argv and "--embeddings" not in launch.argv


def test_an_embeddings_only_llama_config_runs_its_embeddings_weights(layout: Layout) -> None:
    cfg = layout.model("embed", {"embeddingsmodel": _w("embed.gguf")})
    launch = build_launch(cfg, "text", config=layout.router_config(), port=PORT)
    assert _after(launch.argv, "-m") == str(layout.weights / "embed.gguf")


def test_an_sdcpp_image_launch_uses_sd_servers_listen_options(layout: Layout) -> None:
    cfg = layout.model("art", {"sdmodel": _w("image.gguf")})
    config = layout.router_config(sdcpp={"extra_args": ["--vae-tiling"]})
    launch = build_launch(cfg, "image", config=config, port=PORT)
    assert launch.argv == (
        "sd-server",
        "-m",
        str(layout.weights / "image.gguf"),
        "--listen-ip",
        "127.0.0.1",
        "--listen-port",
        str(PORT),
        "--vae-tiling",
    )
    assert (launch.probe, launch.family) == ("sd_models", "sdcpp")


def test_a_whisper_launch_probes_health_and_maps_transcriptions_to_inference(
    layout: Layout,
) -> None:
    cfg = layout.model("ears", {"whispermodel": _w("whisper.gguf")})
    launch = build_launch(cfg, "whisper", config=layout.router_config(), port=PORT)
    assert launch.argv == (
        "whisper-server",
        "-m",
        str(layout.weights / "whisper.gguf"),
        "--host",
        "127.0.0.1",
        "--port",
        str(PORT),
    )
    assert (launch.probe, launch.family) == ("health", "whispercpp")
    assert launch.backend_path("/v1/audio/transcriptions") == "/inference"
    assert launch.backend_path("/v1/audio/translations") == "/inference"
    assert launch.backend_path("/v1/chat/completions") == "/v1/chat/completions"
    # One endpoint serves both: the form tells whisper-server to translate.
    assert launch.form_fields == {"/v1/audio/translations": (("translate", "true"),)}


def test_a_text_launch_passes_client_paths_through_unchanged(layout: Layout) -> None:
    cfg = layout.model("chat", {"model_param": _w("chat.gguf")})
    launch = build_launch(cfg, "text", config=layout.router_config(), port=PORT)
    assert launch.backend_path("/v1/audio/transcriptions") == "/v1/audio/transcriptions"


# -- vllm -------------------------------------------------------------------------------


def test_a_vllm_launch_serves_the_weights_under_the_local_id_and_probes_health(
    layout: Layout,
) -> None:
    cfg = layout.model(
        "big",
        {
            "backend_mode": "vllm",
            "model_param": _w("chat.gguf"),
            "contextsize": 4096,
            "vllm": {"settings": {"max_model_length": 16384, "max_number_sequences": 8}},
        },
    )
    config = layout.router_config(vllm={"extra_args": ["--enforce-eager"]})
    launch = build_launch(cfg, "text", config=config, port=PORT)
    assert launch.argv == (
        "vllm",
        "serve",
        str(layout.weights / "chat.gguf"),
        "--host",
        "127.0.0.1",
        "--port",
        str(PORT),
        "--served-model-name",
        "big",
        "--max-model-len",
        "16384",
        "--max-num-seqs",
        "8",
        "--enforce-eager",
    )
    assert (launch.probe, launch.family) == ("health", "vllm")


# -- kobold -----------------------------------------------------------------------------


def test_a_kobold_launch_hands_koboldcpp_the_kcpps_and_owns_host_and_port(
    layout: Layout,
) -> None:
    cfg = layout.model("kc", {"backend_mode": "kobold", "model_param": _w("chat.gguf")})
    config = layout.router_config(kobold={"binary_path": "/opt/koboldcpp", "extra_args": ["--q"]})
    launch = build_launch(cfg, "text", config=config, port=PORT)
    assert launch.argv == (
        "/opt/koboldcpp",
        "--config",
        str(layout.kcpps / "kc.kcpps"),
        "--host",
        "127.0.0.1",
        "--port",
        str(PORT),
        "--skiplauncher",
        "--q",
    )
    assert (launch.probe, launch.family) == ("models", "kobold")


def test_a_resolved_portable_kobold_config_runs_from_its_resolved_copy(layout: Layout) -> None:
    import dataclasses

    cfg = layout.model("kc", {"backend_mode": "kobold", "model_param": _w("chat.gguf")})
    copy = layout.kcpps.parent / "resolved-kcpps" / "kc.kcpps"
    launch = build_launch(
        dataclasses.replace(cfg, launch_config=copy),
        "text",
        config=layout.router_config(),
        port=PORT,
    )
    assert _after(launch.argv, "--config") == str(copy)


def test_a_kobold_image_only_config_waits_for_an_sd_model(layout: Layout) -> None:
    cfg = layout.model("kc", {"backend_mode": "kobold", "sdmodel": _w("image.gguf")})
    launch = build_launch(cfg, "image", config=layout.router_config(), port=PORT)
    assert launch.probe == "sd_models"


def test_a_kobold_whisper_only_config_waits_for_the_transcribe_flag(layout: Layout) -> None:
    cfg = layout.model("kc", {"backend_mode": "kobold", "whispermodel": _w("whisper.gguf")})
    launch = build_launch(cfg, "whisper", config=layout.router_config(), port=PORT)
    assert (launch.probe, launch.flag) == ("kobold_flag", "transcribe")


def test_a_kobold_embeddings_only_config_waits_for_the_embeddings_flag(layout: Layout) -> None:
    cfg = layout.model("kc", {"backend_mode": "kobold", "embeddingsmodel": _w("embed.gguf")})
    launch = build_launch(cfg, "text", config=layout.router_config(), port=PORT)
    assert (launch.probe, launch.flag) == ("kobold_flag", "embeddings")


def test_a_tts_only_config_runs_its_tts_model_on_the_text_lane(layout: Layout) -> None:
    cfg = layout.model("voice", {"backend_mode": "kobold", "ttsmodel": _w("chat.gguf")})
    launch = build_launch(cfg, "text", config=layout.router_config(), port=PORT)
    # KoboldCpp with only a TTS model is ready when its version says it speaks.
    assert (launch.probe, launch.flag) == ("kobold_flag", "tts")
    sim = layout.model("sim-voice", {"backend_mode": "sim", "ttsmodel": _w("chat.sim.json")})
    launch = build_launch(sim, "text", config=layout.router_config(), port=PORT)
    assert _after(launch.argv, "-m") == str(layout.weights / "chat.sim.json")


# -- already-running servers ------------------------------------------------------------


def test_an_upstream_config_starts_nothing_and_probes_its_models_list(layout: Layout) -> None:
    cfg = layout.model(
        "remote", {"backend_mode": "upstream", "upstream_url": "http://127.0.0.1:9000/"}
    )
    launch = build_launch(cfg, "text", config=layout.router_config(), port=PORT)
    assert launch.argv is None
    assert launch.base_url == "http://127.0.0.1:9000"
    assert (launch.probe, launch.family) == ("models", "upstream")


@pytest.mark.parametrize(
    ("family", "raw", "lane", "probe"),
    [
        ("llama", {"model_param": _w("chat.gguf")}, "text", "models"),
        ("sdcpp", {"sdmodel": _w("image.gguf")}, "image", "sd_models"),
        ("whispercpp", {"whispermodel": _w("whisper.gguf")}, "whisper", "health"),
        ("vllm", {"backend_mode": "vllm", "model_param": _w("chat.gguf")}, "text", "health"),
        ("kobold", {"backend_mode": "kobold", "model_param": _w("chat.gguf")}, "text", "models"),
    ],
)
def test_a_family_backend_url_points_at_that_server_instead_of_starting_one(
    layout: Layout, family: str, raw: dict[str, Any], lane: str, probe: str
) -> None:
    cfg = layout.model("m", raw)
    config = layout.router_config(**{family: {"backend_url": "http://127.0.0.1:7000/"}})
    launch = build_launch(cfg, lane, config=config, port=PORT)  # type: ignore[arg-type]
    assert launch.argv is None
    assert launch.base_url == "http://127.0.0.1:7000"
    assert (launch.probe, launch.family) == (probe, family)


def test_a_backend_url_of_another_family_does_not_redirect_a_launch(layout: Layout) -> None:
    cfg = layout.model("chat", {"model_param": _w("chat.gguf")})
    config = layout.router_config(sdcpp={"backend_url": "http://127.0.0.1:7000"})
    launch = build_launch(cfg, "text", config=config, port=PORT)
    assert launch.argv is not None
    assert launch.base_url == f"http://127.0.0.1:{PORT}"


# -- missing weights --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "field", "lane"),
    [
        ("sim", "model_param", "text"),
        ("sim", "sdmodel", "image"),
        ("llama_sdcpp", "model_param", "text"),
        ("llama_sdcpp", "sdmodel", "image"),
        ("llama_sdcpp", "whispermodel", "whisper"),
        ("vllm", "model_param", "text"),
    ],
)
def test_a_weights_file_that_does_not_exist_cannot_be_launched(
    layout: Layout, mode: str, field: str, lane: str
) -> None:
    cfg = layout.model("gone", {"backend_mode": mode, field: _w("gone.gguf")})
    with pytest.raises(LaunchError, match=r"gone\.gguf does not exist"):
        build_launch(cfg, lane, config=layout.router_config(), port=PORT)  # type: ignore[arg-type]


@pytest.mark.parametrize(("mode", "lane"), [("sim", "image"), ("llama_sdcpp", "whisper")])
def test_a_lane_the_config_has_no_weights_for_cannot_be_launched(
    layout: Layout, mode: str, lane: str
) -> None:
    cfg = layout.model("chat", {"backend_mode": mode, "model_param": _w("chat.gguf")})
    with pytest.raises(LaunchError, match=f"has no {lane} weights"):
        build_launch(cfg, lane, config=layout.router_config(), port=PORT)  # type: ignore[arg-type]


# -- which runtime serves a lane ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["sim", "llama_sdcpp"])
@pytest.mark.parametrize("lane", ["text", "image", "whisper"])
def test_split_backends_give_every_lane_its_own_runtime(
    layout: Layout, mode: str, lane: str
) -> None:
    cfg = layout.model("m", {"backend_mode": mode, "model_param": _w("chat.gguf")})
    assert runtime_lane(cfg, lane) == lane  # type: ignore[arg-type]


@pytest.mark.parametrize("lane", ["text", "image", "whisper"])
def test_every_kobold_lane_lives_on_the_shared_text_runtime(layout: Layout, lane: str) -> None:
    cfg = layout.model("kc", {"backend_mode": "kobold", "model_param": _w("chat.gguf")})
    assert runtime_lane(cfg, lane) == "text"  # type: ignore[arg-type]


def test_a_vllm_transcription_runs_on_the_text_runtime(layout: Layout) -> None:
    cfg = layout.model("big", {"backend_mode": "vllm", "model_param": _w("chat.gguf")})
    assert runtime_lane(cfg, "whisper") == "text"
    assert runtime_lane(cfg, "text") == "text"
