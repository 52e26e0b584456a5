"""Backend adapters: how each inference server family is started, probed and addressed.

An adapter turns (model config, lane) into a `Launch`: the command line of the process to
start (or none, for a server that is already running), where it answers, and which readiness
probe says it is ready. The simulated backend has llama-server's command line, so swapping
`backend_mode: sim` for `llama_sdcpp` changes the binary and nothing else.
"""

from __future__ import annotations

import ssl
import sys
from dataclasses import dataclass, field

from proxy.runtimes.readiness import Probe
from registry.kcpps import Lane, ModelConfig
from registry.tlsclient import ca_ssl_context
from routerproject.config import FamilyConfig, RouterConfig

DEFAULT_BINARIES = {
    "llama": "llama-server",
    "sdcpp": "sd-server",
    "whispercpp": "whisper-server",
    "kobold": "koboldcpp",
    "vllm": "vllm",
}


class LaunchError(Exception):
    """The config cannot be served on this lane (a missing weights file, no binary, ...)."""


@dataclass(frozen=True)
class Launch:
    argv: tuple[str, ...] | None
    """None when nothing is started: an upstream server or a family `backend_url`."""
    base_url: str
    probe: Probe
    flag: str = ""
    family: str = ""
    paths: dict[str, str] = field(default_factory=dict)
    """Client path → backend path where the backend names an endpoint differently."""
    form_fields: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """Client path → form fields a multipart body gets on its way to this backend (where one
    endpoint serves two client paths and a field tells them apart)."""
    tls: ssl.SSLContext | bool = field(default=True, compare=False)
    """What an `https://` backend is verified against (aiohttp's `ssl=`)."""

    def backend_path(self, path: str) -> str:
        return self.paths.get(path, path)


def auth_headers(cfg: ModelConfig) -> dict[str, str]:
    """The Bearer key the config's backend wants on every call, probes included."""
    key = cfg.upstream_api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


def runtime_lane(cfg: ModelConfig, lane: Lane) -> Lane:
    """Which node runtime serves this lane of this config.

    KoboldCpp runs text, image and transcription in one shared process, so all of its lanes
    live on the text-side runtime; everything else gets one runtime per lane.
    """
    if cfg.backend_mode == "kobold":
        return "text"
    if lane == "whisper" and cfg.backend_mode not in ("llama_sdcpp", "sim"):
        return "text"
    return lane


def _weights_for(cfg: ModelConfig, lane: Lane) -> str:
    path = {"text": cfg.text_model, "image": cfg.image_model, "whisper": cfg.whisper_model}[lane]
    if path is None and lane == "text":
        # A config without a text model runs its embeddings, else its TTS model, there.
        path = cfg.embeddings_model or cfg.tts_model
    if path is None:
        raise LaunchError(f"model {cfg.local_id!r} has no {lane} weights")
    if not path.exists():
        raise LaunchError(f"model {cfg.local_id!r}: weights file {path.name} does not exist")
    return str(path)


def _family(config: RouterConfig, name: str) -> FamilyConfig:
    family: FamilyConfig = getattr(config, name)
    return family


def _binary(config: RouterConfig, name: str) -> str:
    return _family(config, name).binary_path or DEFAULT_BINARIES[name]


# What the simulated backend answers once it is ready, per lane (as the real servers do).
_SIM_PROBES: dict[Lane, Probe] = {"text": "models", "image": "sd_models", "whisper": "health"}


def build_launch(cfg: ModelConfig, lane: Lane, *, config: RouterConfig, port: int) -> Launch:
    """The launch for `cfg` on `lane`, listening on `port` when a process is started."""
    host = config.backend.host
    base = f"http://{host}:{port}"
    mode = cfg.backend_mode
    if mode == "upstream":
        assert cfg.upstream_url is not None
        return Launch(
            None,
            cfg.upstream_url.rstrip("/"),
            "models",
            family="upstream",
            tls=ca_ssl_context(cfg.upstream_tls_ca_file),
        )
    if mode == "sim":
        weights = _weights_for(cfg, lane)
        argv = [sys.executable, "-m", "proxy.sim", "-m", weights, "--host", host]
        argv += ["--port", str(port), "-a", cfg.served_model]
        if cfg.context_size:
            argv += ["-c", str(cfg.context_size)]
        if cfg.parallel:
            argv += ["-np", str(cfg.parallel)]
        if cfg.mmproj is not None:
            argv += ["--mmproj", str(cfg.mmproj)]
        argv += cfg.extra_args
        return Launch(tuple(argv), base, _SIM_PROBES[lane], family="sim")
    if mode == "llama_sdcpp":
        if lane == "text":
            return _llama(cfg, config, host, port, base)
        if lane == "image":
            return _sdcpp(cfg, config, host, port, base)
        return _whisper(cfg, config, host, port, base)
    if mode == "vllm":
        return _vllm(cfg, config, host, port, base)
    return _kobold(cfg, config, host, port, base)


def _external(config: RouterConfig, family: str, probe: Probe) -> Launch | None:
    url = _family(config, family).backend_url
    if url:
        return Launch(None, url.rstrip("/"), probe, family=family)
    return None


def _llama(cfg: ModelConfig, config: RouterConfig, host: str, port: int, base: str) -> Launch:
    external = _external(config, "llama", "models")
    if external:
        return external
    argv = [_binary(config, "llama"), "-m", _weights_for(cfg, "text"), "--host", host]
    argv += ["--port", str(port), "--alias", cfg.served_model]
    if cfg.context_size:
        argv += ["-c", str(cfg.context_size)]
    if cfg.parallel:
        argv += ["-np", str(cfg.parallel)]
    if cfg.mmproj is not None:
        argv += ["--mmproj", str(cfg.mmproj)]
    if cfg.raw.get("embeddings") is True:
        argv.append("--embeddings")
    argv += [*config.llama.extra_args, *cfg.extra_args]
    return Launch(tuple(argv), base, "models", family="llama")


def _sdcpp(cfg: ModelConfig, config: RouterConfig, host: str, port: int, base: str) -> Launch:
    external = _external(config, "sdcpp", "sd_models")
    if external:
        return external
    argv = [_binary(config, "sdcpp"), "-m", _weights_for(cfg, "image")]
    argv += ["--listen-ip", host, "--listen-port", str(port)]
    argv += [*config.sdcpp.extra_args, *cfg.extra_args]
    return Launch(tuple(argv), base, "sd_models", family="sdcpp")


def _whisper(cfg: ModelConfig, config: RouterConfig, host: str, port: int, base: str) -> Launch:
    external = _external(config, "whispercpp", "health")
    if external:
        return external
    argv = [_binary(config, "whispercpp"), "-m", _weights_for(cfg, "whisper"), "--host", host]
    argv += ["--port", str(port)]
    argv += [*config.whispercpp.extra_args, *cfg.extra_args]
    # whisper-server serves transcription on /inference rather than the OpenAI path, and
    # translation (to English) there too when the form says `translate`.
    paths = {"/v1/audio/transcriptions": "/inference", "/v1/audio/translations": "/inference"}
    fields: dict[str, tuple[tuple[str, str], ...]] = {
        "/v1/audio/translations": (("translate", "true"),)
    }
    return Launch(tuple(argv), base, "health", family="whispercpp", paths=paths, form_fields=fields)


def _vllm(cfg: ModelConfig, config: RouterConfig, host: str, port: int, base: str) -> Launch:
    external = _external(config, "vllm", "health")
    if external:
        return external
    argv = [_binary(config, "vllm"), "serve", _weights_for(cfg, "text"), "--host", host]
    argv += ["--port", str(port), "--served-model-name", cfg.served_model]
    if cfg.context_size:
        argv += ["--max-model-len", str(cfg.context_size)]
    if cfg.parallel:
        argv += ["--max-num-seqs", str(cfg.parallel)]
    argv += [*config.vllm.extra_args, *cfg.extra_args]
    return Launch(tuple(argv), base, "health", family="vllm")


def _kobold(cfg: ModelConfig, config: RouterConfig, host: str, port: int, base: str) -> Launch:
    external = _external(config, "kobold", "models")
    if external:
        return external
    # KoboldCpp reads everything else from the .kcpps itself; the router owns host and port.
    argv = [_binary(config, "kobold"), "--config", str(cfg.launch_config or cfg.path)]
    argv += ["--host", host]
    argv += ["--port", str(port), "--skiplauncher"]
    argv += [*config.kobold.extra_args, *cfg.extra_args]
    if cfg.has_llm:
        return Launch(tuple(argv), base, "models", family="kobold")
    if cfg.has_image:
        return Launch(tuple(argv), base, "sd_models", family="kobold")
    # Without text or image weights, KoboldCpp is ready when the capability the config brings
    # reports a real `true` in /api/extra/version.
    flag = "transcribe" if cfg.has_voice else "embeddings" if cfg.has_embeddings else "tts"
    return Launch(tuple(argv), base, "kobold_flag", flag=flag, family="kobold")
