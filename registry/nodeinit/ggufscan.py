"""The models in a directory: one per GGUF file (and per simulated weights file), with what
its header says and the vision projector beside it.

Only three header keys are decoded (registry/nodeinit/ggufheader.py); tensor data is never
touched, so a directory of large models is scanned in a moment.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import gguf

from registry.nodeinit.ggufheader import HeaderError, read_values

GGUF_SUFFIX = ".gguf"
SIM_SUFFIX = ".sim.json"
PROJECTOR_ARCH = "clip"
PROJECTOR_MARK = "mmproj"
# A split model (`name-00001-of-00003.gguf`) is loaded from its first part; only that part's
# header holds the metadata.
_SPLIT_RE = re.compile(r"^(?P<base>.+)-(?P<part>\d{5})-of-\d{5}$")
# The quantisation at the end of a file name: two files that differ only there are the same
# model, and a projector named for the model often carries its own (`mmproj-…-f16`).
_QUANT_RE = re.compile(r"[-_.](?:i?q\d\w*|f16|bf16|f32|fp16|fp32)$", re.IGNORECASE)
_UNSAFE_ID_RE = re.compile(r"[^A-Za-z0-9._-]+")
# Of several projectors for one model, the one llama.cpp's own conversions publish first.
_PROJECTOR_PREFERENCE = ("f16", "bf16", "f32")


@dataclass(frozen=True)
class Header:
    architecture: str
    context_length: int | None
    has_chat_template: bool
    embeds: bool = False
    """Pools its output into one vector (`<arch>.pooling_type` set, not none): an embedding
    model, which llama-server serves only with --embeddings, and which cannot chat."""


@dataclass(frozen=True)
class Found:
    """One model config to write: a GGUF text model, or a simulated backend's weights."""

    local_id: str
    path: Path
    sim: bool = False
    context_length: int | None = None
    has_chat_template: bool = False
    embeds: bool = False
    mmproj: Path | None = None


@dataclass
class Scan:
    models: list[Found]
    skipped: list[tuple[Path, str]]
    """Files not made into a model config, with why."""
    unpaired: list[Path]
    """Vision projectors no model was paired with: the operator adds them by hand."""


_ARCH_KEY = "general.architecture"
_TEMPLATE_KEY = "tokenizer.chat_template"
_CONTEXT_SUFFIX = ".context_length"
_POOLING_SUFFIX = ".pooling_type"


def _wanted(key: str) -> bool:
    # The architecture may come after the keys named for it: keep every one of them.
    return key in (_ARCH_KEY, _TEMPLATE_KEY) or key.endswith((_CONTEXT_SUFFIX, _POOLING_SUFFIX))


def read_header(path: Path) -> Header:
    values = read_values(path, _wanted)
    arch = values.get(_ARCH_KEY)
    if not isinstance(arch, str) or not arch:
        raise HeaderError(f"its header has no {_ARCH_KEY}")
    context = values.get(arch + _CONTEXT_SUFFIX)
    template = values.get(_TEMPLATE_KEY)
    pooling = values.get(arch + _POOLING_SUFFIX)
    return Header(
        architecture=arch,
        context_length=context if isinstance(context, int) and context > 0 else None,
        has_chat_template=isinstance(template, str) and bool(template.strip()),
        embeds=isinstance(pooling, int) and pooling != gguf.PoolingType.NONE,
    )


def _base_name(path: Path) -> str:
    """The model a file holds, without quantisation, split part or projector mark."""
    stem = path.name.removesuffix(GGUF_SUFFIX)
    split = _SPLIT_RE.match(stem)
    if split:
        stem = split["base"]
    stem = _QUANT_RE.sub("", stem)
    words = [w for w in re.split(r"[-_.]+", stem.lower()) if w and w != PROJECTOR_MARK]
    return "-".join(words)


def _projector_rank(path: Path) -> tuple[int, str]:
    stem = path.name.lower().removesuffix(GGUF_SUFFIX)
    for rank, precision in enumerate(_PROJECTOR_PREFERENCE):
        if stem.endswith(precision):
            return rank, path.name
    return len(_PROJECTOR_PREFERENCE), path.name


def pair_projectors(models: list[Path], projectors: list[Path]) -> dict[Path, Path]:
    """The vision projector of each model, among those in the same directory.

    A projector named for the model (its name without the quantisation and `mmproj`) is
    its own; otherwise a directory whose models are all one (quantisations of one model,
    as a model repository holds them) takes a projector named for none of them.
    """
    by_dir: dict[Path, list[Path]] = defaultdict(list)
    for projector in projectors:
        by_dir[projector.parent].append(projector)
    bases_in_dir: dict[Path, set[str]] = defaultdict(set)
    for model in models:
        bases_in_dir[model.parent].add(_base_name(model))
    paired: dict[Path, Path] = {}
    for model in models:
        nearby = by_dir.get(model.parent, [])
        named = [p for p in nearby if _base_name(p) == _base_name(model)]
        if not named and len(bases_in_dir[model.parent]) == 1:
            named = [p for p in nearby if _base_name(p) not in bases_in_dir[model.parent]]
        if named:
            paired[model] = min(named, key=_projector_rank)
    return paired


def _model_id(path: Path, taken: set[str]) -> str:
    stem = path.name.removesuffix(SIM_SUFFIX).removesuffix(GGUF_SUFFIX)
    split = _SPLIT_RE.match(stem)
    base = _UNSAFE_ID_RE.sub("-", split["base"] if split else stem).strip("-.") or "model"
    local_id, n = base, 1
    while local_id.lower() in taken:
        n += 1
        local_id = f"{base}-{n}"
    taken.add(local_id.lower())
    return local_id


def _files(models_dir: Path) -> Iterable[Path]:
    for path in sorted(models_dir.rglob("*")):
        if path.is_file() and path.name.lower().endswith((GGUF_SUFFIX, SIM_SUFFIX)):
            yield path


def _classify(path: Path, scan: Scan) -> tuple[Path, Header] | Path | None:
    """A text model (with its header), a projector, or None when skipped (recorded)."""
    split = _SPLIT_RE.match(path.name.removesuffix(GGUF_SUFFIX))
    if split and split["part"] != "00001":
        return None  # a later part of a split model: the first part stands for it
    try:
        header = read_header(path)
    except HeaderError as exc:
        scan.skipped.append((path, str(exc)))
        return None
    if header.architecture == PROJECTOR_ARCH or PROJECTOR_MARK in path.name.lower():
        return path
    if header.context_length is None:
        scan.skipped.append(
            (path, f"no {header.architecture}.context_length in its header (not a text model)")
        )
        return None
    return path, header


def scan_models(models_dir: Path) -> Scan:
    """Every GGUF text model (and `*.sim.json`) under `models_dir`, with its projector."""
    scan = Scan(models=[], skipped=[], unpaired=[])
    texts: list[tuple[Path, Header]] = []
    projectors: list[Path] = []
    sims: list[Path] = []
    for path in _files(models_dir):
        if path.name.lower().endswith(SIM_SUFFIX):
            sims.append(path)
            continue
        kind = _classify(path, scan)
        if isinstance(kind, Path):
            projectors.append(kind)
        elif kind is not None:
            texts.append(kind)
    paired = pair_projectors([path for path, _ in texts], projectors)
    taken: set[str] = set()
    for path, header in texts:
        scan.models.append(
            Found(
                local_id=_model_id(path, taken),
                path=path,
                context_length=header.context_length,
                has_chat_template=header.has_chat_template,
                embeds=header.embeds,
                mmproj=paired.get(path),
            )
        )
    scan.models += [Found(local_id=_model_id(path, taken), path=path, sim=True) for path in sims]
    scan.unpaired = [p for p in projectors if p not in set(paired.values())]
    return scan
