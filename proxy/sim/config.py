"""The simulated backend's command line (llama-server's, with its aliases) and its weights file,
whose numbers set every simulated time."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

DEFAULT_HOST = "127.0.0.1"
DEFAULT_TRANSCRIBE_MS_PER_AUDIO_SECOND = 50.0
DEFAULT_EMBEDDING_DIM = 8

_NUMBER_KEYS = (
    "load_ms",
    "base_ms",
    "prompt_ms_per_token",
    "output_ms_per_token",
    "image_ms_per_megapixel_step",
    "transcribe_ms_per_audio_second",
)

# Value options we understand, with the llama-server / sd-server / whisper-server
# spellings that mean the same thing. Everything else on the command line is ignored.
_VALUE_OPTIONS: dict[str, str] = {
    "-m": "model",
    "--model": "model",
    "--diffusion-model": "model",
    "--host": "host",
    "--listen-ip": "host",
    "--port": "port",
    "--listen-port": "port",
    "-c": "ctx_size",
    "--ctx-size": "ctx_size",
    "--mmproj": "mmproj",
    "-np": "parallel",
    "--parallel": "parallel",
    "-a": "alias",
    "--alias": "alias",
    "--api-key": "api_key",
}
_FLAG_OPTIONS = ("--embeddings", "--embedding")
# Behaviours of servers the router fronts as upstreams, which tests switch on: a vLLM or an
# Ollama answers 404 to a model name it does not serve, and some servers answer under their own
# name whatever the request said. Not llama-server options; the router never passes them.
_SIM_FLAGS = {"--sim-strict-model": "strict_model", "--sim-answer-as-alias": "answer_as_alias"}


class WeightsError(Exception):
    """The weights JSON is missing or invalid."""


@dataclass(frozen=True)
class SimWeights:
    load_ms: float = 0.0
    base_ms: float = 0.0
    prompt_ms_per_token: float = 0.0
    output_ms_per_token: float = 0.0
    image_ms_per_megapixel_step: float = 0.0
    transcribe_ms_per_audio_second: float = DEFAULT_TRANSCRIBE_MS_PER_AUDIO_SECOND
    embedding_dim: int = DEFAULT_EMBEDDING_DIM
    vision: bool = False
    prompt_cache_entries: int = 0
    """Prompts remembered, as llama-server's prompt cache: 0 keeps every prompt at full price."""


@dataclass(frozen=True)
class SimConfig:
    weights_path: str
    host: str
    port: int
    alias: str
    mmproj: str | None = None
    ctx_size: int | None = None
    parallel: int | None = None
    embeddings: bool = False
    api_key: str | None = None
    strict_model: bool = False
    answer_as_alias: bool = False


def load_weights(path: str) -> SimWeights:
    """Read and validate a `*.sim.json` weights file; WeightsError says what is wrong."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise WeightsError(f"cannot read weights file {path}: {exc.strerror or exc}") from exc
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise WeightsError(f"weights file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise WeightsError(f"weights file {path} must hold a JSON object")
    values: dict[str, Any] = {}
    for key in _NUMBER_KEYS:
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WeightsError(f"weights file {path}: {key} must be a number")
        if not math.isfinite(value) or value < 0:
            raise WeightsError(f"weights file {path}: {key} must be a finite number >= 0")
        values[key] = float(value)
    if "embedding_dim" in data:
        dim = data["embedding_dim"]
        if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
            raise WeightsError(f"weights file {path}: embedding_dim must be a positive integer")
        values["embedding_dim"] = dim
    if "prompt_cache_entries" in data:
        entries = data["prompt_cache_entries"]
        if isinstance(entries, bool) or not isinstance(entries, int) or entries < 0:
            raise WeightsError(f"weights file {path}: prompt_cache_entries must be an integer >= 0")
        values["prompt_cache_entries"] = entries
    if "vision" in data:
        if not isinstance(data["vision"], bool):
            raise WeightsError(f"weights file {path}: vision must be true or false")
        values["vision"] = data["vision"]
    return SimWeights(**values)


def _known_args(argv: Sequence[str]) -> list[str]:
    """Keep only our options and their values.

    argparse alone would read llama-server's `-mg 0` as `-m g` (short options take
    glued values), so the real server's other flags are dropped before parsing.
    """
    kept: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        name, eq, _ = token.partition("=")
        if token in _VALUE_OPTIONS:
            kept.extend(argv[index : index + 2])
            index += 2
            continue
        if (
            (eq and name.startswith("--") and name in _VALUE_OPTIONS)
            or token in _FLAG_OPTIONS
            or token in _SIM_FLAGS
        ):
            kept.append(token)
        index += 1
    return kept


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be a port number 0-65535")
    return value


def parse_args(argv: Sequence[str]) -> SimConfig:
    """Parse a llama-server style command line; exits 2 (argparse) when it is unusable."""
    parser = argparse.ArgumentParser(
        prog="python -m proxy.sim",
        description="Simulated llama-server / sd-server / whisper-server.",
        allow_abbrev=False,
    )
    for option, dest in _VALUE_OPTIONS.items():
        if dest == "model":
            continue
        kind: Callable[[str], Any] = str
        if dest == "port":
            kind = _port
        elif dest in ("ctx_size", "parallel"):
            kind = _non_negative_int
        parser.add_argument(option, dest=dest, type=kind)
    parser.add_argument("-m", "--model", "--diffusion-model", dest="model", required=True)
    parser.add_argument(*_FLAG_OPTIONS, dest="embeddings", action="store_true")
    for flag, dest in _SIM_FLAGS.items():
        parser.add_argument(flag, dest=dest, action="store_true")
    args = parser.parse_args(_known_args(argv))
    if args.port is None:
        parser.error("--port is required")
    stem = Path(args.model).name
    for suffix in (".sim.json", ".json"):
        if stem.endswith(suffix) and len(stem) > len(suffix):
            stem = stem[: -len(suffix)]
            break
    return SimConfig(
        weights_path=args.model,
        host=args.host or DEFAULT_HOST,
        port=args.port,
        alias=args.alias or stem,
        mmproj=args.mmproj,
        ctx_size=args.ctx_size,
        parallel=args.parallel,
        embeddings=args.embeddings,
        api_key=args.api_key,
        strict_model=args.strict_model,
        answer_as_alias=args.answer_as_alias,
    )
