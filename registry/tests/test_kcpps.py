from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from registry.hashing import FileHasher, config_hash
from registry.identity import merge
from registry.kcpps import (
    REASON_CONCURRENT,
    REASON_NO_CONTEXT,
    REASON_NOT_TEXT,
    ModelConfig,
    ModelConfigError,
    load_model_config,
    scan_config_dir,
)

DEMO_KCPPS_DIR = Path(__file__).resolve().parents[2] / "demo" / "kcpps"
SIM_WEIGHTS = {"load_ms": 10, "base_ms": 1, "vision": False}


def _lines_hash(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """A config dir beside a weights dir, as in demo/: configs refer to ../weights/…"""
    (tmp_path / "kcpps").mkdir()
    weights = tmp_path / "weights"
    weights.mkdir()
    for name in ("chat-small", "chat-vision", "image-sd", "whisper", "embed"):
        (weights / f"{name}.sim.json").write_text(json.dumps(SIM_WEIGHTS | {"name": name}))
    return tmp_path / "kcpps"


def _write(config_dir: Path, name: str, raw: Any) -> Path:
    path = config_dir / f"{name}.kcpps"
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    return path


def _load(config_dir: Path, name: str, raw: Any, *, default: str = "kobold") -> ModelConfig:
    path = _write(config_dir, name, raw)
    return load_model_config(path, default_backend_mode=default, hasher=FileHasher(None))


CHAT_SMALL = {
    "model_param": "../weights/chat-small.sim.json",
    "backend_mode": "sim",
    "contextsize": 4096,
    "parallel": 1,
}
CHAT_VISION = CHAT_SMALL | {
    "model_param": "../weights/chat-vision.sim.json",
    "mmproj": "../weights/chat-vision.sim.json",
}
IMAGE_SD = {"sdmodel": "../weights/image-sd.sim.json", "backend_mode": "sim", "parallel": 1}
WHISPER = {"whispermodel": "../weights/whisper.sim.json", "backend_mode": "sim", "parallel": 1}


# --- loading and fields --------------------------------------------------------------------


def test_it_loads_a_chat_config_with_resolved_paths_and_sizes(layout: Path) -> None:
    config = _load(layout, "chat-small", CHAT_SMALL)
    weights = layout.parent / "weights" / "chat-small.sim.json"
    assert config.local_id == "chat-small"
    assert config.filename == "chat-small.kcpps"
    assert config.path == layout / "chat-small.kcpps"
    assert config.text_model == weights
    assert config.image_model is None
    assert config.backend_mode == "sim"
    assert config.context_size == 4096
    assert config.parallel == 1
    assert config.size == weights.stat().st_size
    assert config.created == int((layout / "chat-small.kcpps").stat().st_mtime)
    assert config.config_hash == config_hash(CHAT_SMALL)
    assert len(config.model_hash) == 64
    assert config.missing_files == ()


def test_it_counts_a_file_shared_by_two_fields_once_in_the_size(layout: Path) -> None:
    config = _load(layout, "chat-vision", CHAT_VISION)
    assert config.size == (layout.parent / "weights" / "chat-vision.sim.json").stat().st_size


def test_it_uses_the_node_default_backend_mode_when_the_file_has_none(layout: Path) -> None:
    raw = {"model_param": "../weights/chat-small.sim.json"}
    assert _load(layout, "m", raw, default="llama_sdcpp").backend_mode == "llama_sdcpp"


def test_it_records_missing_weights_without_failing(layout: Path) -> None:
    config = _load(layout, "ghost", {"model_param": "../weights/ghost.gguf", "contextsize": 2048})
    assert config.missing_files == (str(layout.parent / "weights" / "ghost.gguf"),)
    assert config.size == 0
    assert config.model_hash != ""


def test_two_copies_at_different_paths_share_both_hashes(tmp_path: Path) -> None:
    for node in ("node-a", "node-b"):
        (tmp_path / node / "deep").mkdir(parents=True)
        (tmp_path / node / "deep" / "w.gguf").write_bytes(b"weights")
    first = _load(tmp_path / "node-a", "m", {"model_param": "deep/w.gguf", "contextsize": 4096})
    second = _load(
        tmp_path / "node-b",
        "m",
        {"contextsize": 4096, "model_param": str(tmp_path / "node-b" / "deep" / "w.gguf")},
    )
    assert (first.model_hash, first.config_hash) == (second.model_hash, second.config_hash)


def test_vllm_settings_supply_context_and_parallelism(layout: Path) -> None:
    raw = {
        "model_param": "../weights/chat-small.sim.json",
        "backend_mode": "vllm",
        "contextsize": 4096,
        "vllm": {"settings": {"max_model_length": 32768, "max_number_sequences": 8}},
    }
    config = _load(layout, "big", raw)
    assert (config.context_size, config.parallel) == (32768, 8)


def test_vllm_settings_fill_in_only_what_a_non_vllm_config_lacks(layout: Path) -> None:
    raw = {
        "model_param": "../weights/chat-small.sim.json",
        "contextsize": 4096,
        "vllm": {"settings": {"max_model_length": 32768, "max_number_sequences": 8}},
    }
    config = _load(layout, "m", raw)
    assert (config.context_size, config.parallel) == (4096, 8)


# --- capabilities --------------------------------------------------------------------------


def test_a_sim_chat_model_is_text_and_embeddings_only(layout: Path) -> None:
    config = _load(layout, "chat-small", CHAT_SMALL)
    assert (config.has_llm, config.has_image, config.has_voice, config.has_multimodal) == (
        True,
        False,
        False,
        False,
    )
    assert config.has_embeddings is True
    assert config.image_id is None
    assert config.capabilities() == {
        "llm": True,
        "embeddings": {"model": "chat-small.sim.json", "separate": False},
        "context": 4096,
    }


def test_a_chat_model_with_a_projector_is_multimodal(layout: Path) -> None:
    config = _load(layout, "chat-vision", CHAT_VISION)
    assert config.has_multimodal is True
    assert config.capabilities()["multimodal"] == {"projector": "chat-vision.sim.json"}


def test_a_projector_without_a_text_model_is_not_multimodal(layout: Path) -> None:
    raw = {"sdmodel": "../weights/image-sd.sim.json", "mmproj": "../weights/chat-vision.sim.json"}
    assert _load(layout, "odd", raw).has_multimodal is False


def test_an_image_config_gets_an_image_id_from_its_weights(layout: Path) -> None:
    config = _load(layout, "image-sd", IMAGE_SD)
    assert (config.has_llm, config.has_image, config.has_embeddings) == (False, True, False)
    assert config.image_id == "image-sd-image-sd"
    assert config.capabilities() == {"llm": False, "image": {"model": "image-sd.sim.json"}}


def test_an_image_id_strips_the_real_weights_extension(layout: Path) -> None:
    raw = {"sdmodel": "/models/dream.safetensors", "sdvae": "/models/vae.pt"}
    config = _load(layout, "X", raw)
    assert config.image_id == "X-dream"
    assert config.capabilities()["image"] == {"model": "dream.safetensors", "vae": "vae.pt"}


def test_a_whisper_config_is_voice_only(layout: Path) -> None:
    config = _load(layout, "whisper", WHISPER)
    assert (config.has_llm, config.has_voice, config.has_embeddings) == (False, True, False)
    assert config.capabilities() == {"llm": False, "voice": {"whisper_model": "whisper.sim.json"}}


def test_a_tts_model_makes_a_chat_model_speak_without_making_it_hear(layout: Path) -> None:
    raw = {"model_param": "../weights/chat-small.sim.json", "backend_mode": "kobold"}
    assert _load(layout, "plain", raw).has_tts is False
    speaker = _load(layout, "speaker", raw | {"ttsmodel": "../weights/chat-small.sim.json"})
    assert (speaker.has_llm, speaker.has_tts, speaker.has_voice) == (True, True, False)
    assert speaker.capabilities()["voice"] == {"tts_model": "chat-small.sim.json"}
    record = speaker.to_record(
        node_id="n", node_url="http://n", source="local", available=True, loaded=False
    )
    assert (record["has_tts"], record["has_voice"]) == (True, False)
    # A server the router does not start says so in its config.
    upstream = {"backend_mode": "upstream", "upstream_url": "http://127.0.0.1:1", "tts": True}
    assert _load(layout, "remote", upstream).has_tts is True
    assert _load(layout, "quoted", upstream | {"tts": "true"}).has_tts is False


def test_a_tts_model_alone_is_a_config_that_only_speaks(layout: Path) -> None:
    # README, "Voice": a model speaks when its config names a ttsmodel; nothing else is needed.
    voice = _load(layout, "voice", {"ttsmodel": "../weights/chat-small.sim.json"})
    assert (voice.has_llm, voice.has_tts, voice.has_voice, voice.has_embeddings) == (
        False,
        True,
        False,
        False,
    )
    assert voice.tts_model == (layout.parent / "weights" / "chat-small.sim.json").resolve()
    with pytest.raises(ModelConfigError) as empty:
        _load(layout, "nothing", {"contextsize": 2048})
    assert empty.value.key == "model_param" and "ttsmodel" in str(empty.value)


def test_a_kobold_chat_model_has_embeddings_only_when_asked(layout: Path) -> None:
    raw = {"model_param": "../weights/chat-small.sim.json", "backend_mode": "kobold"}
    assert _load(layout, "plain", raw).has_embeddings is False
    assert _load(layout, "flagged", raw | {"embeddings": True}).has_embeddings is True


def test_a_llama_chat_model_has_embeddings_only_when_its_config_enables_them(
    layout: Path,
) -> None:
    # llama-server answers /v1/embeddings with 501 unless started with --embeddings.
    raw = {"model_param": "../weights/chat-small.sim.json", "backend_mode": "llama_sdcpp"}
    plain = _load(layout, "plain", raw)
    assert plain.has_embeddings is False and "embeddings" not in plain.capabilities()
    assert _load(layout, "flagged", raw | {"embeddings": True}).has_embeddings is True
    own_flag = _load(layout, "own", raw | {"extra_args": ["--embeddings", "--pooling", "mean"]})
    assert own_flag.has_embeddings is True
    assert own_flag.to_record(
        node_id="n", node_url="http://n", source="local", available=True, loaded=False
    )["has_embeddings"]


def test_a_sim_and_an_upstream_chat_model_keep_their_embeddings(layout: Path) -> None:
    assert _load(layout, "chat-small", CHAT_SMALL).has_embeddings is True
    upstream = {"backend_mode": "upstream", "upstream_url": "http://127.0.0.1:9"}
    assert _load(layout, "up", upstream).has_embeddings is True


def test_extra_args_are_kept_in_order_with_numbers_as_text(layout: Path) -> None:
    raw = CHAT_SMALL | {"extra_args": ["--pooling", "mean", "-t", 2, "--temp", 0.5]}
    config = _load(layout, "chat-small", raw)
    assert config.extra_args == ("--pooling", "mean", "-t", "2", "--temp", "0.5")
    assert _load(layout, "bare", CHAT_SMALL).extra_args == ()


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("--pooling mean", "extra_args"),
        ({"pooling": "mean"}, "extra_args"),
        (["--pooling", None], "extra_args[1]"),
        (["--pooling", True], "extra_args[1]"),
        (["", "x"], "extra_args[0]"),
        (["-t", "2", "--port", "9"], "extra_args[2]"),
        (["--host=0.0.0.0"], "extra_args[0]"),
        (["-m", "other.gguf"], "extra_args[0]"),
        (["--alias", "someone-else"], "extra_args[0]"),
    ],
)
def test_bad_extra_args_name_the_offending_item(layout: Path, value: Any, key: str) -> None:
    with pytest.raises(ModelConfigError) as info:
        _load(layout, "chat-small", CHAT_SMALL | {"extra_args": value})
    assert info.value.key == key


@pytest.mark.parametrize(
    ("mode", "raw", "slot"),
    [
        ("llama_sdcpp", {"contextsize": 4096, "parallel": 2}, 2048),
        ("llama_sdcpp", {"contextsize": 4096, "parallel": 3}, 1365),
        ("llama_sdcpp", {"contextsize": 4096}, 4096),
        ("llama_sdcpp", {"contextsize": 4096, "parallel": 1}, 4096),
        ("sim", {"contextsize": 4096, "parallel": 4}, 1024),
        # A unified cache lets every slot use the whole window.
        ("llama_sdcpp", {"contextsize": 4096, "parallel": 2, "extra_args": ["-kvu"]}, 4096),
        ("llama_sdcpp", {"contextsize": 4096, "parallel": 2, "extra_args": ["--kv-unified"]}, 4096),
        # vLLM's max_model_len is per sequence already.
        (
            "vllm",
            {"vllm": {"settings": {"max_model_length": 8192, "max_number_sequences": 4}}},
            8192,
        ),
    ],
)
def test_the_record_reports_the_context_of_one_slot(
    layout: Path, mode: str, raw: dict[str, Any], slot: int
) -> None:
    config = _load(
        layout, "m", {"model_param": "../weights/chat-small.sim.json"} | raw, default=mode
    )
    record = config.to_record(
        node_id="n", node_url="http://n", source="local", available=True, loaded=False
    )
    assert config.slot_context == slot
    assert record["context_size"] == slot and record["capabilities"]["context"] == slot
    assert config.context_size == raw.get("contextsize", 8192)


def test_a_separate_embeddings_model_is_reported_as_such(layout: Path) -> None:
    raw = {"embeddingsmodel": "../weights/embed.sim.json", "backend_mode": "kobold"}
    config = _load(layout, "embed", raw)
    assert (config.has_llm, config.has_embeddings) == (False, True)
    assert config.capabilities()["embeddings"] == {"model": "embed.sim.json", "separate": True}


def test_an_upstream_config_is_a_text_model_without_weights(layout: Path) -> None:
    raw = {"backend_mode": "upstream", "upstream_url": "http://127.0.0.1:8080", "contextsize": 8192}
    config = _load(layout, "remote", raw)
    assert config.upstream_url == "http://127.0.0.1:8080"
    assert (config.has_llm, config.has_embeddings) == (True, True)
    assert config.model_hash == ""
    assert config.text_eligible_reason is None


def test_a_portable_reference_counts_as_the_model_but_is_unresolved(layout: Path) -> None:
    raw = {"model_param_hash": "0f" * 32, "model_param_filename": "llama.gguf", "contextsize": 4096}
    config = _load(layout, "portable", raw)
    assert config.has_llm is True
    assert config.text_model is None
    assert config.unresolved_fields == ("model_param",)
    record = config.to_record(
        node_id="n", node_url="http://n", source="local", available=True, loaded=False
    )
    assert record["unresolved_fields"] == ["model_param"]


def test_image_loras_given_only_as_portable_hashes_are_unresolved_and_named(
    layout: Path,
) -> None:
    hashes = ["0a" * 32, "1b" * 32]
    raw = {
        "sdmodel_hash": "2c" * 32,
        "sdmodel_filename": "dream.safetensors",
        "sdlora_hash": hashes,
        "sdlora_filename": ["style.safetensors", "detail.safetensors"],
    }
    config = _load(layout, "portable-image", raw)
    assert config.unresolved_fields == ("sdlora", "sdmodel")
    assert config.capabilities()["image"] == {
        "model": "dream.safetensors",
        "lora": ["style.safetensors", "detail.safetensors"],
    }
    assert config.model_hash == _lines_hash(
        [f"sdmodel={'2c' * 32}", f"sdlora[0]={hashes[0]}", f"sdlora[1]={hashes[1]}"]
    )


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"sdmodel_hash": "2c" * 32, "sdlora_hash": ["0a" * 32, "AB" * 32]}, "sdlora_hash"),
        ({"sdmodel_hash": "2c" * 32, "sdlora_hash": ["0a" * 32, 7]}, "sdlora_hash"),
        ({"sdmodel_hash": "2c" * 32, "sdlora_filename": ["ok.gguf", "a/b"]}, "sdlora_filename"),
        ({"model_param_hash": ["0a" * 32]}, "model_param_hash"),
    ],
)
def test_every_element_of_a_portable_list_is_checked(
    tmp_path: Path, raw: dict[str, Any], key: str
) -> None:
    with pytest.raises(ModelConfigError) as caught:
        _load(tmp_path, "m", raw)
    assert caught.value.key == key


def test_bare_file_names_on_two_nodes_make_replicas_of_one_model(tmp_path: Path) -> None:
    # Each node keeps its weights beside the config under its own file name.
    records = []
    for node, name in (("node-a", "llama-7b.gguf"), ("node-b", "llama-copy.gguf")):
        (tmp_path / node).mkdir()
        (tmp_path / node / name).write_bytes(b"the same weights")
        config = _load(tmp_path / node, "llama", {"model_param": name, "contextsize": 4096})
        records.append(
            config.to_record(
                node_id=node,
                node_url=f"http://{node}",
                source="local",
                available=True,
                loaded=False,
            )
        )
    assert records[0]["config_hash"] == records[1]["config_hash"]
    assert records[0]["model_hash"] == records[1]["model_hash"] != ""
    view = merge([records[0]], {"node-b": [records[1]]}, previous={})
    assert [(r["node_id"], r["public_id"]) for r in view.records] == [
        ("node-a", "llama"),
        ("node-b", "llama"),
    ]


# --- text eligibility ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (CHAT_SMALL, None),
        ({**CHAT_SMALL, "parallel": None}, None),
        (IMAGE_SD, REASON_NOT_TEXT),
        (WHISPER, REASON_NOT_TEXT),
        ({"model_param": "../weights/chat-small.sim.json"}, REASON_NO_CONTEXT),
        ({**CHAT_SMALL, "parallel": 2}, REASON_CONCURRENT),
    ],
)
def test_text_eligibility_gives_the_first_reason_that_applies(
    layout: Path, raw: dict[str, Any], reason: str | None
) -> None:
    assert _load(layout, "m", raw).text_eligible_reason == reason


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"model_param": "a.gguf", "backend_mode": "ollama"}, "backend_mode"),
        ({"backend_mode": "upstream"}, "upstream_url"),
        ({"backend_mode": "upstream", "upstream_url": "ftp://h/x"}, "upstream_url"),
        ({"backend_mode": "upstream", "upstream_url": "/relative"}, "upstream_url"),
        ({"model_param": "a.gguf", "upstream_url": "http://h:1"}, "upstream_url"),
        ({"model_param": "a.gguf", "contextsize": 0}, "contextsize"),
        ({"model_param": "a.gguf", "contextsize": "4096"}, "contextsize"),
        ({"model_param": "a.gguf", "contextsize": True}, "contextsize"),
        ({"model_param": "a.gguf", "parallel": 0}, "parallel"),
        ({"model_param": "a.gguf", "parallel": 1.5}, "parallel"),
        ({"model_param": "a.gguf", "vllm": []}, "vllm"),
        ({"model_param": "a.gguf", "vllm": {"settings": 3}}, "vllm.settings"),
        (
            {"model_param": "a.gguf", "vllm": {"settings": {"max_model_length": -1}}},
            "vllm.settings.max_model_length",
        ),
        (
            {"model_param": "a.gguf", "vllm": {"settings": {"max_number_sequences": 0}}},
            "vllm.settings.max_number_sequences",
        ),
        ({"model_param": 7}, "model_param"),
        ({"model_param": ["a.gguf"]}, "model_param"),
        ({"model_param": "a.gguf", "sdlora": ["ok", 3]}, "sdlora"),
        ({"model_param": "a.gguf", "lora": {"x": 1}}, "lora"),
        ({"contextsize": 4096, "mmproj": "p.gguf"}, "model_param"),
        ({"model_param": "a.gguf", "model_param_hash": "ab" * 32}, "model_param"),
        ({"model_param_hash": "AB" * 32}, "model_param_hash"),
        ({"model_param_hash": "ab" * 32, "model_param_filename": "a/b"}, "model_param_filename"),
        (
            {"model_param_hash": "ab" * 32, "model_param_filename": "CON.gguf"},
            "model_param_filename",
        ),
    ],
)
def test_each_validation_error_names_the_key(tmp_path: Path, raw: dict[str, Any], key: str) -> None:
    with pytest.raises(ModelConfigError) as caught:
        _load(tmp_path, "m", raw)
    assert caught.value.key == key
    assert str(caught.value).startswith(f"m.kcpps: {key}: ")


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '"text"', ""])
def test_it_rejects_a_file_that_is_not_a_json_object(tmp_path: Path, content: str) -> None:
    with pytest.raises(ModelConfigError) as caught:
        _load(tmp_path, "m", content)
    assert caught.value.key is None
    assert caught.value.path == tmp_path / "m.kcpps"


def test_it_rejects_a_file_name_that_is_not_a_valid_model_id(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match="file name"):
        _load(tmp_path, "bad name", {"model_param": "a.gguf"})


def test_it_accepts_null_and_empty_optional_settings_as_unset(tmp_path: Path) -> None:
    raw: dict[str, object] = {
        "model_param": "a.gguf",
        "sdmodel": "",
        "mmproj": None,
        "lora": [],
        "upstream_url": "",
        "contextsize": None,
    }
    config = _load(tmp_path, "m", raw)
    assert (config.image_model, config.mmproj, config.context_size) == (None, None, None)


# --- scanning ------------------------------------------------------------------------------


def test_scanning_keeps_going_past_a_bad_file(layout: Path) -> None:
    _write(layout, "whisper", WHISPER)
    _write(layout, "broken", "{")
    _write(layout, "chat-small", CHAT_SMALL)
    _write(layout, "nomodel", {"contextsize": 4096})
    (layout / "notes.txt").write_text("ignored")
    (layout / "nested").mkdir()
    _write(layout / "nested", "hidden", CHAT_SMALL)

    configs, errors = scan_config_dir(
        layout, default_backend_mode="kobold", hasher=FileHasher(None)
    )

    assert [config.local_id for config in configs] == ["chat-small", "whisper"]
    assert sorted(error.path.name for error in errors) == ["broken.kcpps", "nomodel.kcpps"]


def test_scanning_an_unreadable_dir_reports_an_error(tmp_path: Path) -> None:
    configs, errors = scan_config_dir(
        tmp_path / "absent", default_backend_mode="kobold", hasher=FileHasher(None)
    )
    assert configs == []
    assert len(errors) == 1


def test_the_demo_configs_load_with_the_expected_capabilities() -> None:
    configs, errors = scan_config_dir(
        DEMO_KCPPS_DIR, default_backend_mode="kobold", hasher=FileHasher(None)
    )
    assert errors == []
    by_id = {config.local_id: config for config in configs}
    assert sorted(by_id) == ["chat-small", "chat-vision", "image-sd", "whisper"]
    assert {config.backend_mode for config in configs} == {"sim"}
    assert by_id["chat-small"].text_eligible_reason is None
    assert by_id["chat-vision"].has_multimodal is True
    assert by_id["image-sd"].image_id == "image-sd-image-sd"
    assert by_id["whisper"].has_voice is True


# --- records -------------------------------------------------------------------------------


def test_a_record_carries_the_documented_fields(layout: Path) -> None:
    config = _load(layout, "image-sd", IMAGE_SD)
    record = config.to_record(
        node_id="gpu-1",
        node_url="http://10.0.0.2:5001",
        source="local",
        available=True,
        loaded=False,
    )
    assert record["public_id"] == record["local_id"] == "image-sd"
    assert record["image_id"] == record["public_image_id"] == "image-sd-image-sd"
    assert record["filename"] == "image-sd.kcpps"
    assert record["has_music"] is False
    assert record["model_hash"] == config.model_hash
    assert record["config_hash"] == config.config_hash
    assert record["backend_mode"] == "sim"
    assert (record["source"], record["node_id"], record["node_url"]) == (
        "local",
        "gpu-1",
        "http://10.0.0.2:5001",
    )
    assert (record["available"], record["loaded"]) == (True, False)
    assert record["options"]["sdmodel"] == "image-sd.sim.json"
    json.dumps(record)


def test_a_record_without_image_weights_has_no_image_ids(layout: Path) -> None:
    record = _load(layout, "chat-small", CHAT_SMALL).to_record(
        node_id="n", node_url="http://n", source="local", available=True, loaded=True
    )
    assert "image_id" not in record
    assert "public_image_id" not in record


def test_record_options_never_contain_a_path(layout: Path) -> None:
    raw = CHAT_VISION | {
        "sdlora": ["/abs/lora-a.safetensors", "C:\\win\\lora-b.safetensors"],
        "chatcompletionsadapter": "/etc/adapters/custom.json",
        "nested": {"draftmodel": "/abs/draft.gguf"},
    }
    record = _load(layout, "chat-vision", raw).to_record(
        node_id="n", node_url="http://n", source="local", available=True, loaded=False
    )
    options = record["options"]

    def strings(value: Any) -> list[str]:
        if isinstance(value, dict):
            return [s for item in value.values() for s in strings(item)]
        if isinstance(value, list):
            return [s for item in value for s in strings(item)]
        return [value] if isinstance(value, str) else []

    assert all("/" not in value and "\\" not in value for value in strings(options))
    assert options["sdlora"] == ["lora-a.safetensors", "lora-b.safetensors"]
    assert options["model_param"] == "chat-vision.sim.json"
    assert str(layout) not in json.dumps(record)


def test_record_options_drop_credentials(layout: Path) -> None:
    raw = CHAT_SMALL | {"password": "hunter2", "hordekey": "k", "hordeworkername": "w"}
    record = _load(layout, "chat-small", raw).to_record(
        node_id="n", node_url="http://n", source="local", available=True, loaded=False
    )
    assert "password" not in record["options"]
    assert "hordekey" not in record["options"]
    assert record["options"]["hordeworkername"] == "w"
    assert "hunter2" not in json.dumps(record)


def test_record_options_keep_an_upstream_url_without_its_credentials(layout: Path) -> None:
    raw = {"backend_mode": "upstream", "upstream_url": "http://user:pw@10.0.0.9:8080/v1?key=s"}
    options = _load(layout, "remote", raw).to_record(
        node_id="n", node_url="http://n", source="local", available=True, loaded=False
    )["options"]
    assert options["upstream_url"] == "http://10.0.0.9:8080/v1"


def test_the_created_time_follows_the_file_mtime(layout: Path) -> None:
    path = _write(layout, "m", CHAT_SMALL)
    os.utime(path, (1_700_000_000, 1_700_000_000))
    config = load_model_config(path, default_backend_mode="kobold", hasher=FileHasher(None))
    assert config.created == 1_700_000_000


# --- upstream_model, the upstream key and declared vision -----------------------------------

UPSTREAM = {"backend_mode": "upstream", "upstream_url": "http://127.0.0.1:8000"}


def test_an_upstream_model_names_what_the_backend_serves_and_defaults_to_the_stem(
    layout: Path,
) -> None:
    named = _load(layout, "qwen", UPSTREAM | {"upstream_model": "Qwen/Qwen2.5-7B-Instruct"})
    assert (named.local_id, named.served_model) == ("qwen", "Qwen/Qwen2.5-7B-Instruct")
    assert named.capabilities()["served_model"] == "Qwen/Qwen2.5-7B-Instruct"
    plain = _load(layout, "llama3", UPSTREAM)
    assert (plain.upstream_model, plain.served_model) == (None, "llama3")


@pytest.mark.parametrize("value", ["", "  ", " padded", 7, ["a"], "tab\there"])
def test_a_bad_upstream_model_is_refused_naming_it(layout: Path, value: Any) -> None:
    with pytest.raises(ModelConfigError) as refused:
        _load(layout, "qwen", UPSTREAM | {"upstream_model": value})
    assert refused.value.key == "upstream_model"


def test_the_upstream_key_comes_from_a_file_or_an_environment_variable(
    layout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (layout / "key.txt").write_text("sk-from-file\n")
    from_file = _load(layout, "a", UPSTREAM | {"upstream_api_key_file": "key.txt"})
    assert from_file.upstream_api_key == "sk-from-file"
    monkeypatch.setenv("ROUTER_TEST_KEY", "sk-from-env")
    from_env = _load(layout, "b", UPSTREAM | {"upstream_api_key_env": "ROUTER_TEST_KEY"})
    assert from_env.upstream_api_key == "sk-from-env"
    # The key is in no printed form of the config, nor in what travels to other nodes.
    assert "sk-from-env" not in repr(from_env)
    record = from_env.to_record(
        node_id="n", node_url="http://n", source="local", available=True, loaded=False
    )
    assert "sk-from-env" not in json.dumps(record)
    assert _load(layout, "c", UPSTREAM).upstream_api_key is None


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"upstream_api_key_file": "missing.txt"}, "upstream_api_key_file"),
        ({"upstream_api_key_file": "empty.txt"}, "upstream_api_key_file"),
        ({"upstream_api_key_file": 3}, "upstream_api_key_file"),
        ({"upstream_api_key_env": "ROUTER_TEST_UNSET_KEY"}, "upstream_api_key_env"),
        ({"upstream_api_key_env": ""}, "upstream_api_key_env"),
        (
            {"upstream_api_key_file": "key.txt", "upstream_api_key_env": "ROUTER_TEST_KEY"},
            "upstream_api_key_file",
        ),
    ],
)
def test_an_unusable_upstream_key_source_is_refused_naming_it(
    layout: Path, monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], key: str
) -> None:
    (layout / "key.txt").write_text("sk-1")
    (layout / "empty.txt").write_text("\n")
    monkeypatch.setenv("ROUTER_TEST_KEY", "sk-2")
    monkeypatch.delenv("ROUTER_TEST_UNSET_KEY", raising=False)
    with pytest.raises(ModelConfigError) as refused:
        _load(layout, "qwen", UPSTREAM | extra)
    assert refused.value.key == key
    assert "sk-" not in str(refused.value)


def test_a_config_that_declares_vision_is_multimodal_without_a_projector(layout: Path) -> None:
    seeing = _load(layout, "eye", UPSTREAM | {"vision": True})
    assert seeing.has_multimodal
    assert not _load(layout, "blind", UPSTREAM | {"vision": False}).has_multimodal
    # Vision is a property of a text model: an image-only config does not read images.
    assert not _load(layout, "pic", IMAGE_SD | {"vision": True}).has_multimodal
    with pytest.raises(ModelConfigError) as refused:
        _load(layout, "odd", UPSTREAM | {"vision": "yes"})
    assert refused.value.key == "vision"


def test_vision_the_server_reports_makes_an_upstream_record_multimodal(layout: Path) -> None:
    cfg = _load(layout, "eye", UPSTREAM)
    args: dict[str, Any] = {
        "node_id": "n",
        "node_url": "http://n",
        "source": "local",
        "available": True,
    }
    assert cfg.to_record(**args, loaded=False)["has_multimodal"] is False
    said = cfg.to_record(**args, loaded=False, reported_vision=True)
    assert said["has_multimodal"] is True
    assert said["capabilities"]["multimodal"] == {"projector": None, "reported": True}
    # An image-only config never becomes a vision text model, whatever is reported.
    image = _load(layout, "pic", IMAGE_SD)
    assert image.to_record(**args, loaded=False, reported_vision=True)["has_multimodal"] is False
