"""Model configs (`.kcpps` JSON files): parsing, validation, capabilities and ModelRecords.

One file per model config in ``models.config_dir``; the file stem is the local model id
(contract §3). This module only reads files and hashes weights: it never starts a backend,
so a config whose weights are missing still loads here and merely records what is missing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

# The reasons stay importable from here, where the model records are built.
from registry.eligibility import REASON_CONCURRENT as REASON_CONCURRENT
from registry.eligibility import REASON_NO_CONTEXT as REASON_NO_CONTEXT
from registry.eligibility import REASON_NOT_TEXT as REASON_NOT_TEXT
from registry.eligibility import config_text_ineligible_reason
from registry.hashing import (
    LIST_PATH_FIELDS,
    PATH_FIELDS,
    PORTABLE_HASH_SUFFIX,
    FileHasher,
    config_hash,
    is_sha256_hex,
    model_hash,
    path_base_name,
    resolve_model_path,
)
from registry.options import sanitise_options
from registry.tlsclient import upstream_ca_file

BACKEND_MODES = ("kobold", "llama_sdcpp", "vllm", "sim", "upstream")
# The node's runtime sides a config can be served on; the config's capabilities say which.
Lane = Literal["text", "image", "whisper"]
CONFIG_SUFFIX = ".kcpps"
# Backends that serve /v1/embeddings from any text model (the sim imitates a llama-server
# started for it; an upstream OpenAI-compatible server is assumed to). llama-server itself
# answers 501 unless started with --embeddings, so a llama_sdcpp config has embeddings only
# when it asks for them ("embeddings": true, or the flag in its own extra_args).
EMBEDDINGS_FROM_TEXT_BACKENDS = frozenset({"sim", "upstream"})
EMBEDDINGS_FLAGS = frozenset({"--embeddings", "--embedding"})
# Backends that split their context window evenly between their slots (llama-server with
# `-np N` gives each request `contextsize / N` tokens, and the sim imitates it); unless the
# cache is unified, when every slot may use the whole window.
PER_SLOT_CONTEXT_BACKENDS = frozenset({"llama_sdcpp", "sim"})
UNIFIED_CACHE_FLAGS = frozenset({"-kvu", "--kv-unified"})
# Options the router sets itself on every backend it starts (weights, address, served name):
# a config's own extra_args may not override them.
ROUTER_OWNED_OPTIONS = frozenset(
    {
        "-m",
        "--model",
        "--host",
        "--port",
        "-a",
        "--alias",
        "--listen-ip",
        "--listen-port",
        "--served-model-name",
        "--config",
    }
)
# At least one of these must be set, otherwise the config runs nothing.
# A config needs one of these; a TTS model alone is enough, as KoboldCpp speaks without a text
# model (README, "Voice").
PRIMARY_MODEL_FIELDS = ("model_param", "sdmodel", "whispermodel", "embeddingsmodel", "ttsmodel")
PORTABLE_FILENAME_SUFFIX = "_filename"
PORTABLE_HF_SUFFIX = "_hf"
PORTABLE_FILENAME_MAX_CHARS = 255


_LOCAL_ID_RE = re.compile(r"[A-Za-z0-9._-]+")
_UNSAFE_FILENAME_CHARS_RE = re.compile(r'[\\/:"<>|?*\x00-\x1f\x7f]')
_WINDOWS_DEVICE_NAMES = frozenset(
    {"CON", "PRN", "AUX", "NUL"}
    | {f"COM{i}" for i in range(1, 10)}
    | {f"LPT{i}" for i in range(1, 10)}
)


class ModelConfigError(Exception):
    """A .kcpps that cannot be used; ``key`` names the offending setting when there is one."""

    def __init__(self, path: Path, key: str | None, message: str) -> None:
        self.path = path
        self.key = key
        self.message = message
        prefix = f"{path.name}: {key}: " if key is not None else f"{path.name}: "
        super().__init__(prefix + message)


@dataclass(frozen=True)
class ModelConfig:
    local_id: str
    filename: str
    path: Path
    # Parsed JSON; shared, so treat as read-only. Excluded from hash() because dicts are not.
    raw: Mapping[str, Any] = field(hash=False)
    backend_mode: str
    text_model: Path | None
    image_model: Path | None
    whisper_model: Path | None
    mmproj: Path | None
    embeddings_model: Path | None
    context_size: int | None
    parallel: int | None
    upstream_url: str | None
    config_hash: str
    model_hash: str
    created: int
    size: int
    # Absolute paths of referenced weight files that do not exist; the router refuses to
    # load such a config rather than let the backend fail half-way.
    missing_files: tuple[str, ...] = ()
    # Path fields given only in portable form (`<field>_hash`) that no local path resolves
    # yet (reference-cluster §7.2); loading must wait for asset resolution.
    unresolved_fields: tuple[str, ...] = ()
    # A resolved portable config runs from a copy with local paths (the file itself stays
    # portable); backends that read the config file itself are given this copy.
    launch_config: Path | None = None
    # The config's own backend arguments (`"extra_args"`), after the family's.
    extra_args: tuple[str, ...] = ()
    # The model ID the backend serves it under (`"upstream_model"`): a vLLM's
    # `Qwen/Qwen2.5-7B-Instruct` or an Ollama's `llama3:8b`, which no file stem can spell.
    upstream_model: str | None = None
    # The Bearer key the backend wants (`"upstream_api_key_file"` or `"upstream_api_key_env"`),
    # read when the config is; kept out of repr so that no log line of the config shows it.
    upstream_api_key: str | None = field(default=None, repr=False)
    # The CA an `https://` upstream is verified against (None: the system's store).
    upstream_tls_ca_file: Path | None = None
    # KoboldCpp's TTS model (`"ttsmodel"`); a config with nothing else runs it on the text lane.
    tts_model: Path | None = None

    @property
    def served_model(self) -> str:
        """The model ID sent to the backend (and the name a started backend serves it under)."""
        return self.upstream_model or self.local_id

    @property
    def has_llm(self) -> bool:
        return (
            self.text_model is not None
            or "model_param" in self.unresolved_fields
            or self.backend_mode == "upstream"
        )

    @property
    def has_image(self) -> bool:
        return self.image_model is not None or "sdmodel" in self.unresolved_fields

    @property
    def has_voice(self) -> bool:
        return self.whisper_model is not None or "whispermodel" in self.unresolved_fields

    @property
    def has_tts(self) -> bool:
        # KoboldCpp speaks with a TTS model beside its text model; a server the router did not
        # start (vLLM, an upstream) says so in its config with `"tts": true`.
        return (
            _field_file_name(self.raw, "ttsmodel") is not None
            or "ttsmodel" in self.unresolved_fields
            or self.raw.get("tts") is True
        )

    @property
    def has_multimodal(self) -> bool:
        # A projector makes a llama-server multimodal; a vLLM or upstream server reads images
        # by itself, which its config states with `"vision": true`.
        if not self.has_llm:
            return False
        return (
            self.mmproj is not None
            or "mmproj" in self.unresolved_fields
            or self.raw.get("vision") is True
        )

    @property
    def has_embeddings(self) -> bool:
        if self.embeddings_model is not None or "embeddingsmodel" in self.unresolved_fields:
            return True
        if self.raw.get("embeddings") is True or EMBEDDINGS_FLAGS.intersection(self.extra_args):
            return True
        return self.has_llm and self.backend_mode in EMBEDDINGS_FROM_TEXT_BACKENDS

    @property
    def slot_context(self) -> int | None:
        """Tokens one request may use: the context window, or one slot's share of it."""
        if self.context_size is None or self.backend_mode not in PER_SLOT_CONTEXT_BACKENDS:
            return self.context_size
        if not self.parallel or UNIFIED_CACHE_FLAGS.intersection(self.extra_args):
            return self.context_size
        return max(1, self.context_size // self.parallel)

    @property
    def image_id(self) -> str | None:
        name = _field_file_name(self.raw, "sdmodel")
        if name is None:
            return None
        return f"{self.local_id}-{_weights_stem(name)}"

    @property
    def text_eligible_reason(self) -> str | None:
        """Why this config cannot be linked as a text model for lending (None: it can).

        Judged from the values the file states, not from the merged `context_size` and
        `parallel` the backend is launched with (registry/eligibility.py says why).
        """
        return config_text_ineligible_reason(has_llm=self.has_llm, raw=self.raw)

    def capabilities(self) -> dict[str, Any]:
        caps: dict[str, Any] = {"llm": self.has_llm}
        if self.has_image:
            image: dict[str, Any] = {"model": _field_file_name(self.raw, "sdmodel")}
            vae = _field_file_name(self.raw, "sdvae")
            if vae is not None:
                image["vae"] = vae
            loras = _field_file_names(self.raw, "sdlora")
            if loras:
                image["lora"] = loras
            caps["image"] = image
        if self.has_embeddings:
            separate = self.embeddings_model is not None or "embeddingsmodel" in (
                self.unresolved_fields
            )
            model = (
                _field_file_name(self.raw, "embeddingsmodel")
                or _field_file_name(self.raw, "model_param")
                or self.local_id
            )
            caps["embeddings"] = {"model": model, "separate": separate}
        if self.has_multimodal:
            caps["multimodal"] = {"projector": _field_file_name(self.raw, "mmproj")}
        if self.upstream_model is not None:
            caps["served_model"] = self.upstream_model
        if self.has_voice or self.has_tts:
            voice: dict[str, Any] = {}
            if self.has_voice:
                voice["whisper_model"] = _field_file_name(self.raw, "whispermodel")
            tts = _field_file_name(self.raw, "ttsmodel")
            if tts is not None:
                voice["tts_model"] = tts
            caps["voice"] = voice
        if self.slot_context is not None:
            caps["context"] = self.slot_context
        return caps

    def to_record(
        self,
        *,
        node_id: str,
        node_url: str,
        source: str,
        available: bool,
        loaded: bool,
        disabled: bool = False,
        reported_vision: bool = False,
    ) -> dict[str, Any]:
        """The ModelRecord JSON (reference-cluster §2.4), before public-id suffixing.

        `reported_vision`: the server behind an upstream config says its model reads images.
        """
        record: dict[str, Any] = {
            "public_id": self.local_id,
            "local_id": self.local_id,
        }
        image_id = self.image_id
        if image_id is not None:
            record["image_id"] = image_id
            record["public_image_id"] = image_id
        record.update(self._described(reported_vision))
        record.update(
            {
                "source": source,
                "node_id": node_id,
                "node_url": node_url,
                "available": available,
                "loaded": loaded,
                "disabled": disabled,
                # What one request may use (a slot's share): clients size prompts by it and
                # the lending gate checks against it.
                "context_size": self.slot_context,
                "parallel": self.parallel,
                # Lending eligibility travels with the record so a master can judge models on
                # other nodes without their files.
                "text_ineligible_reason": self.text_eligible_reason,
            }
        )
        if reported_vision and not self.has_multimodal and self.has_llm:
            record["capabilities"]["multimodal"] = {"projector": None, "reported": True}
        if self.unresolved_fields:
            # Until every portable reference is resolved to a verified file, a load is refused
            # and a request waits for the resolution (reference-cluster §7.2).
            record["asset_state"] = "unresolved"
            record["unresolved_fields"] = list(self.unresolved_fields)
        return record

    def _described(self, reported_vision: bool) -> dict[str, Any]:
        """The record's account of the config itself: its file, models, hashes and options."""
        return {
            "filename": self.filename,
            "created": self.created,
            "size": self.size,
            "has_llm": self.has_llm,
            "has_image": self.has_image,
            "has_embeddings": self.has_embeddings,
            "has_multimodal": self.has_multimodal or (self.has_llm and reported_vision),
            "has_voice": self.has_voice,
            "has_tts": self.has_tts,
            "has_music": False,
            "model_hash": self.model_hash,
            "config_hash": self.config_hash,
            "capabilities": self.capabilities(),
            "options": sanitise_options(self.raw),
            "backend_mode": self.backend_mode,
        }


def _weights_stem(name: str) -> str:
    # "image-sd.sim.json" names the same model as "image-sd.safetensors" would.
    stem = Path(name).stem
    return stem.removesuffix(".sim")


def _field_file_name(raw: Mapping[str, Any], name: str) -> str | None:
    """Base name of a single-file field, from the path or else from its portable filename."""
    value = raw.get(name)
    if isinstance(value, str) and value != "":
        return path_base_name(value)
    if isinstance(value, list):
        names = _field_file_names(raw, name)
        return names[0] if names else None
    portable = raw.get(name + PORTABLE_FILENAME_SUFFIX)
    if isinstance(portable, str) and portable != "":
        return portable
    return None


def _field_file_names(raw: Mapping[str, Any], name: str) -> list[str]:
    value = raw.get(name)
    if isinstance(value, str) and value != "":
        return [path_base_name(value)]
    if isinstance(value, list):
        return [path_base_name(item) for item in value if isinstance(item, str) and item != ""]
    portable = raw.get(name + PORTABLE_FILENAME_SUFFIX)
    if isinstance(portable, str) and portable != "":
        return [portable]
    if isinstance(portable, list):
        return [item for item in portable if isinstance(item, str) and item != ""]
    return []


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_safe_filename(value: str) -> bool:
    """A portable file name: one path component, no reserved characters or device names."""
    if value in ("", ".", "..") or len(value) > PORTABLE_FILENAME_MAX_CHARS:
        return False
    if _UNSAFE_FILENAME_CHARS_RE.search(value) or value[-1] in ". ":
        return False
    return value.split(".", 1)[0].upper() not in _WINDOWS_DEVICE_NAMES


def _validate_positive_int(
    path: Path, raw: Mapping[str, Any], key: str, label: str, minimum: int
) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if not _is_int(value) or value < minimum:
        raise ModelConfigError(path, label, f"must be an integer >= {minimum}, got {value!r}")
    assert isinstance(value, int)
    return value


def _validate_upstream_url(path: Path, value: object) -> str:
    if not isinstance(value, str) or value == "":
        raise ModelConfigError(path, "upstream_url", "is required with backend_mode upstream")
    try:
        parts = urlsplit(value)
        hostname = parts.hostname
    except ValueError as exc:
        raise ModelConfigError(path, "upstream_url", f"is not a valid URL: {exc}") from None
    if parts.scheme.lower() not in ("http", "https") or not hostname:
        raise ModelConfigError(
            path, "upstream_url", f"must be an absolute http(s) URL, got {value!r}"
        )
    return value


def _validate_portable(path: Path, raw: Mapping[str, Any], name: str) -> None:
    """Portable keys (reference-cluster §7.2) must be well-formed and never mix with a path."""
    listed = name in LIST_PATH_FIELDS
    hash_key = name + PORTABLE_HASH_SUFFIX
    filename_key = name + PORTABLE_FILENAME_SUFFIX
    hf_key = name + PORTABLE_HF_SUFFIX
    portable_keys = [key for key in (hash_key, filename_key, hf_key) if raw.get(key) is not None]
    if not portable_keys:
        return
    value = raw.get(name)
    if value not in (None, "", []):
        raise ModelConfigError(
            path, name, f"holds both a path and portable keys ({', '.join(portable_keys)})"
        )

    def items(key: str) -> list[object]:
        current = raw.get(key)
        if current is None:
            return []
        if listed and isinstance(current, list):
            return list(current)
        if isinstance(current, str):
            return [current]
        raise ModelConfigError(path, key, "must be a string" + (" or a list" if listed else ""))

    for digest in items(hash_key):
        if not is_sha256_hex(digest):
            raise ModelConfigError(path, hash_key, "must be 64 lower-case hex characters")
    for name_value in items(filename_key):
        if not isinstance(name_value, str) or not is_safe_filename(name_value):
            raise ModelConfigError(path, filename_key, f"is not a safe file name: {name_value!r}")
    for origin in items(hf_key):
        if not isinstance(origin, str) or not origin.startswith("hf://"):
            raise ModelConfigError(path, hf_key, "must be an hf:// reference")


def _validate_path_fields(path: Path, raw: Mapping[str, Any]) -> None:
    for name in sorted(PATH_FIELDS):
        value = raw.get(name)
        if value is None or isinstance(value, str):
            pass
        elif name in LIST_PATH_FIELDS and isinstance(value, list):
            if not all(isinstance(item, str) for item in value):
                raise ModelConfigError(path, name, "must be a list of strings")
        else:
            expected = "a string or a list of strings" if name in LIST_PATH_FIELDS else "a string"
            raise ModelConfigError(path, name, f"must be {expected}")
        _validate_portable(path, raw, name)


def _references_model(raw: Mapping[str, Any], name: str) -> bool:
    value = raw.get(name)
    if isinstance(value, str) and value != "":
        return True
    return raw.get(name + PORTABLE_HASH_SUFFIX) is not None


def _optional_path(raw: Mapping[str, Any], name: str, base_dir: Path) -> Path | None:
    value = raw.get(name)
    if isinstance(value, str) and value != "":
        return resolve_model_path(value, base_dir=base_dir)
    return None


def _referenced_files(raw: Mapping[str, Any], base_dir: Path) -> list[Path]:
    """Every weight file a path field names, each once, in field order."""
    seen: dict[Path, None] = {}
    for name in sorted(PATH_FIELDS):
        value = raw.get(name)
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, str) and item != "":
                seen.setdefault(resolve_model_path(item, base_dir=base_dir), None)
    return list(seen)


def _extra_args(path: Path, raw: Mapping[str, Any]) -> tuple[str, ...]:
    """The config's own backend arguments; numbers are taken as their text, as in YAML."""
    value = raw.get("extra_args")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ModelConfigError(path, "extra_args", "must be a list of strings")
    args: list[str] = []
    for index, item in enumerate(value):
        if isinstance(item, int | float) and not isinstance(item, bool):
            item = str(item)
        if not isinstance(item, str) or item == "":
            raise ModelConfigError(
                path, f"extra_args[{index}]", f"must be a non-empty string, got {item!r}"
            )
        if item.partition("=")[0] in ROUTER_OWNED_OPTIONS:
            raise ModelConfigError(
                path, f"extra_args[{index}]", f"{item!r} is set by the router and cannot be given"
            )
        args.append(item)
    return tuple(args)


def _upstream_model(path: Path, raw: Mapping[str, Any]) -> str | None:
    value = raw.get("upstream_model")
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ModelConfigError(path, "upstream_model", "must be a non-empty string")
    if value != value.strip() or any(ord(ch) < 32 for ch in value):
        raise ModelConfigError(
            path, "upstream_model", "must not have surrounding spaces or control characters"
        )
    return value


def _vision(path: Path, raw: Mapping[str, Any]) -> None:
    value = raw.get("vision")
    if value is not None and not isinstance(value, bool):
        raise ModelConfigError(path, "vision", f"must be true or false, got {value!r}")


def _upstream_api_key(path: Path, raw: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """The Bearer key from the file or environment variable the config names (never both)."""
    file_value = raw.get("upstream_api_key_file")
    env_value = raw.get("upstream_api_key_env")
    if file_value is not None and env_value is not None:
        raise ModelConfigError(
            path, "upstream_api_key_file", "give upstream_api_key_file or upstream_api_key_env"
        )
    if file_value is not None:
        if not isinstance(file_value, str) or not file_value:
            raise ModelConfigError(path, "upstream_api_key_file", "must be a file path")
        key_path = resolve_model_path(file_value, base_dir=path.parent)
        try:
            key = key_path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ModelConfigError(
                path, "upstream_api_key_file", f"cannot be read: {reason or exc}"
            ) from None
        where = "upstream_api_key_file"
    elif env_value is not None:
        if not isinstance(env_value, str) or not env_value:
            raise ModelConfigError(
                path, "upstream_api_key_env", "must name an environment variable"
            )
        key = environ.get(env_value, "").strip()
        where = "upstream_api_key_env"
        if not key:
            raise ModelConfigError(path, where, f"environment variable {env_value} is not set")
    else:
        return None
    if not key:
        raise ModelConfigError(path, where, "the key is empty")
    if any(ord(ch) < 33 or ord(ch) == 127 for ch in key):
        raise ModelConfigError(path, where, "the key must be one line without spaces")
    return key


def _vllm_settings(path: Path, raw: Mapping[str, Any]) -> Mapping[str, Any]:
    vllm = raw.get("vllm")
    if vllm is None:
        return {}
    if not isinstance(vllm, Mapping):
        raise ModelConfigError(path, "vllm", "must be an object")
    settings = vllm.get("settings")
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise ModelConfigError(path, "vllm.settings", "must be an object")
    return settings


def _read_raw(path: Path) -> tuple[dict[str, Any], int]:
    """The config file's JSON object and its modification time (Unix seconds)."""
    try:
        data = path.read_bytes()
        created = int(path.stat().st_mtime)
    except OSError as exc:
        raise ModelConfigError(path, None, f"cannot be read: {exc.strerror or exc}") from None
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelConfigError(path, None, f"is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(path, None, "must be a JSON object")
    return raw, created


def _backend_mode(path: Path, raw: Mapping[str, Any], default: str) -> tuple[str, str | None]:
    """(backend mode, upstream URL when the mode is upstream)."""
    backend_mode = raw.get("backend_mode")
    if backend_mode is None:
        backend_mode = default
    elif backend_mode not in BACKEND_MODES:
        raise ModelConfigError(
            path, "backend_mode", f"must be one of {', '.join(BACKEND_MODES)}, got {backend_mode!r}"
        )
    if backend_mode == "upstream":
        return backend_mode, _validate_upstream_url(path, raw.get("upstream_url"))
    if raw.get("upstream_url") not in (None, ""):
        raise ModelConfigError(path, "upstream_url", "is only allowed with backend_mode upstream")
    return backend_mode, None


def _window_and_parallel(
    path: Path, raw: Mapping[str, Any], backend_mode: str
) -> tuple[int | None, int | None]:
    """The context window and concurrency the config runs with on its backend."""
    context_size = _validate_positive_int(path, raw, "contextsize", "contextsize", 1)
    parallel = _validate_positive_int(path, raw, "parallel", "parallel", 1)
    settings = _vllm_settings(path, raw)
    vllm_context = _validate_positive_int(
        path, settings, "max_model_length", "vllm.settings.max_model_length", 1
    )
    vllm_parallel = _validate_positive_int(
        path, settings, "max_number_sequences", "vllm.settings.max_number_sequences", 1
    )
    # koboldcpp writes contextsize into every config, but a vllm backend ignores it and runs
    # with its own settings, so those win when the config actually runs on vllm.
    if backend_mode == "vllm":
        return (
            vllm_context if vllm_context is not None else context_size,
            vllm_parallel if vllm_parallel is not None else parallel,
        )
    return (
        context_size if context_size is not None else vllm_context,
        parallel if parallel is not None else vllm_parallel,
    )


def _files_on_disk(
    raw: Mapping[str, Any], base_dir: Path
) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    """(bytes of the referenced files that exist, missing files, fields given only by hash)."""
    files = _referenced_files(raw, base_dir)
    missing = tuple(str(file) for file in files if not file.is_file())
    unresolved = tuple(
        name
        for name in sorted(PATH_FIELDS)
        if raw.get(name) in (None, "", []) and raw.get(name + PORTABLE_HASH_SUFFIX) is not None
    )
    size = 0
    for file in files:
        try:
            if file.is_file():
                size += file.stat().st_size
        except OSError:
            continue
    return size, missing, unresolved


def load_model_config(path: Path, *, default_backend_mode: str, hasher: FileHasher) -> ModelConfig:
    """Parse and validate one .kcpps; raises ModelConfigError naming the offending key."""
    if default_backend_mode not in BACKEND_MODES:
        raise ValueError(f"unknown default backend mode {default_backend_mode!r}")
    path = Path(os.path.abspath(path))
    local_id = path.stem
    if not _LOCAL_ID_RE.fullmatch(local_id):
        raise ModelConfigError(
            path, None, "the file name must consist of letters, digits, '.', '_' or '-'"
        )
    raw, created = _read_raw(path)
    return build_model_config(
        path, raw, created=created, default_backend_mode=default_backend_mode, hasher=hasher
    )


def build_model_config(
    path: Path,
    raw: dict[str, Any],
    *,
    created: int,
    default_backend_mode: str,
    hasher: FileHasher,
) -> ModelConfig:
    """Validate parsed config JSON read from `path` (absolute) into a ModelConfig."""
    local_id = path.stem
    backend_mode, upstream_url = _backend_mode(path, raw, default_backend_mode)
    context_size, parallel = _window_and_parallel(path, raw, backend_mode)
    extra_args = _extra_args(path, raw)
    upstream_model = _upstream_model(path, raw)
    upstream_api_key = _upstream_api_key(path, raw, os.environ)
    upstream_ca, problem = upstream_ca_file(raw, path.parent, backend_mode)
    if problem:
        raise ModelConfigError(path, "upstream_tls_ca_file", problem)
    _vision(path, raw)
    _validate_path_fields(path, raw)
    if backend_mode != "upstream" and not any(
        _references_model(raw, name) for name in PRIMARY_MODEL_FIELDS
    ):
        raise ModelConfigError(
            path,
            "model_param",
            "no model weights: set model_param, sdmodel, whispermodel, embeddingsmodel or ttsmodel",
        )
    base_dir = path.parent
    size, missing, unresolved = _files_on_disk(raw, base_dir)
    return ModelConfig(
        local_id=local_id,
        filename=path.name,
        path=path,
        raw=raw,
        backend_mode=backend_mode,
        text_model=_optional_path(raw, "model_param", base_dir),
        image_model=_optional_path(raw, "sdmodel", base_dir),
        whisper_model=_optional_path(raw, "whispermodel", base_dir),
        mmproj=_optional_path(raw, "mmproj", base_dir),
        embeddings_model=_optional_path(raw, "embeddingsmodel", base_dir),
        context_size=context_size,
        parallel=parallel,
        upstream_url=upstream_url,
        config_hash=config_hash(raw),
        model_hash=model_hash(raw, base_dir=base_dir, hasher=hasher),
        created=created,
        size=size,
        missing_files=missing,
        unresolved_fields=unresolved,
        extra_args=extra_args,
        upstream_model=upstream_model,
        upstream_api_key=upstream_api_key,
        upstream_tls_ca_file=upstream_ca,
        tts_model=_optional_path(raw, "ttsmodel", base_dir),
    )


def portable_references(raw: Mapping[str, Any], name: str) -> list[tuple[str, str, str | None]]:
    """(sha256, file name, hf origin) of each portable reference of path field `name`.

    Only meaningful on a validated config; a list field gives one entry per element.
    """
    hashes = raw.get(name + PORTABLE_HASH_SUFFIX)
    names = raw.get(name + PORTABLE_FILENAME_SUFFIX)
    origins = raw.get(name + PORTABLE_HF_SUFFIX)
    if hashes is None:
        return []

    def as_list(value: object, count: int) -> list[Any]:
        if isinstance(value, list):
            return list(value) + [None] * (count - len(value))
        return [value] * count if count == 1 else [None] * count

    digests = hashes if isinstance(hashes, list) else [hashes]
    count = len(digests)
    file_names = as_list(names, count)
    hf = as_list(origins, count)
    out: list[tuple[str, str, str | None]] = []
    for index, digest in enumerate(digests):
        file_name = file_names[index] if isinstance(file_names[index], str) else ""
        origin = hf[index] if isinstance(hf[index], str) else None
        out.append((str(digest), file_name or str(digest), origin))
    return out


def with_resolved_paths(
    cfg: ModelConfig, paths: Mapping[str, list[str]], *, hasher: FileHasher
) -> ModelConfig:
    """`cfg` with each portable field replaced by the local files it resolved to.

    The file on disk is left as it is (it stays portable); the node runs this copy.
    """
    raw = dict(cfg.raw)
    for name, files in paths.items():
        for suffix in (PORTABLE_HASH_SUFFIX, PORTABLE_FILENAME_SUFFIX, PORTABLE_HF_SUFFIX):
            raw.pop(name + suffix, None)
        listed = isinstance(cfg.raw.get(name + PORTABLE_HASH_SUFFIX), list)
        raw[name] = list(files) if listed else files[0]
    return build_model_config(
        cfg.path,
        raw,
        created=cfg.created,
        default_backend_mode=cfg.backend_mode,
        hasher=hasher,
    )


def scan_config_dir(
    config_dir: Path, *, default_backend_mode: str, hasher: FileHasher
) -> tuple[list[ModelConfig], list[ModelConfigError]]:
    """Load every *.kcpps directly in ``config_dir``; one bad file never hides the others."""
    if default_backend_mode not in BACKEND_MODES:
        raise ValueError(f"unknown default backend mode {default_backend_mode!r}")
    configs: list[ModelConfig] = []
    errors: list[ModelConfigError] = []
    try:
        candidates = sorted(
            entry for entry in config_dir.iterdir() if entry.suffix == CONFIG_SUFFIX
        )
    except OSError as exc:
        errors.append(ModelConfigError(config_dir, None, f"cannot be listed: {exc.strerror}"))
        return configs, errors
    for candidate in candidates:
        try:
            configs.append(
                load_model_config(
                    candidate, default_backend_mode=default_backend_mode, hasher=hasher
                )
            )
        except ModelConfigError as exc:
            errors.append(exc)
    configs.sort(key=lambda config: config.local_id)
    return configs, errors
