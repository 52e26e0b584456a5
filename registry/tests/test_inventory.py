"""The inventory's machine-facing parts: memory readings, the nvidia-smi probe, file listing."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from registry.inventory import (
    HardwareProbe,
    files_list,
    include_files_parse,
    meminfo_parse,
    nvidia_smi_parse,
    recipes_doc,
)
from registry.recipes import Component, Recipe
from routerproject.errors import RouterError

GIB = 1024**3
MIB = 1024**2
MEMINFO = """MemTotal:       16384000 kB
MemFree:         1000000 kB
MemAvailable:   12288000 kB
Buffers:          200000 kB
Cached:          3000000 kB
HugePages_Total:       0
"""


def meminfo_file(tmp_path: Path, text: str = MEMINFO) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(text)
    return path


def script(tmp_path: Path, name: str, body: str) -> str:
    """A stand-in for nvidia-smi: a real executable the probe runs as it would the real one."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


# -- memory readings -----------------------------------------------------------------------


def test_meminfo_counts_what_is_not_available_as_used() -> None:
    memory = meminfo_parse(MEMINFO)
    assert memory == {
        "kind": "ram",
        "total_bytes": 16384000 * 1024,
        "used_bytes": (16384000 - 12288000) * 1024,
    }


def test_meminfo_without_memavailable_falls_back_to_free_buffers_and_cache() -> None:
    old_kernel = "\n".join(ln for ln in MEMINFO.splitlines() if "MemAvailable" not in ln)
    memory = meminfo_parse(old_kernel)
    assert memory is not None
    assert memory["used_bytes"] == (16384000 - 1000000 - 200000 - 3000000) * 1024


def test_meminfo_without_a_total_is_no_reading() -> None:
    assert meminfo_parse("MemFree: 10 kB\n") is None
    assert meminfo_parse("") is None
    assert meminfo_parse("MemTotal: lots\n") is None


def test_meminfo_never_reports_more_used_than_total() -> None:
    memory = meminfo_parse("MemTotal: 100 kB\nMemAvailable: 500 kB\n")
    assert memory is not None and memory["used_bytes"] == 0


def test_nvidia_smi_sums_every_gpu_and_skips_one_without_numbers() -> None:
    memory = nvidia_smi_parse("24576, 1024\n8192, 512\n[N/A], [N/A]\n")
    assert memory == {"kind": "vram", "total_bytes": 32768 * MIB, "used_bytes": 1536 * MIB}


def test_nvidia_smi_output_without_numbers_is_no_reading() -> None:
    assert nvidia_smi_parse("") is None
    assert nvidia_smi_parse("No devices were found\n") is None


# -- the hardware probe --------------------------------------------------------------------


async def test_vram_is_reported_when_nvidia_smi_answers(tmp_path: Path) -> None:
    smi = script(tmp_path, "smi", 'echo "8192, 2048"')
    probe = HardwareProbe(meminfo_path=meminfo_file(tmp_path), nvidia_smi=smi)
    hardware = await probe.read()
    assert hardware["memory"] == {
        "kind": "vram",
        "total_bytes": 8 * GIB,
        "used_bytes": 2 * GIB,
    }
    assert hardware["note"] == ""
    assert hardware["cpu_count"] == os.cpu_count()


async def test_a_failing_nvidia_smi_falls_back_to_ram_and_says_why(tmp_path: Path) -> None:
    smi = script(tmp_path, "smi", 'echo "NVIDIA-SMI has failed" >&2; exit 9')
    probe = HardwareProbe(meminfo_path=meminfo_file(tmp_path), nvidia_smi=smi)
    hardware = await probe.read()
    assert hardware["memory"]["kind"] == "ram"
    assert "NVIDIA-SMI has failed" in hardware["note"]


async def test_a_hanging_nvidia_smi_is_given_up_on_and_the_loop_keeps_running(
    tmp_path: Path,
) -> None:
    smi = script(tmp_path, "smi", "exec sleep 30")
    probe = HardwareProbe(meminfo_path=meminfo_file(tmp_path), nvidia_smi=smi, timeout_secs=0.5)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    running = asyncio.create_task(ticker())
    started = time.monotonic()
    try:
        hardware = await probe.read()
    finally:
        running.cancel()
    assert time.monotonic() - started < 5
    assert hardware["memory"]["kind"] == "ram"
    assert "did not answer within 0.5 s" in hardware["note"]
    # The probe waited half a second in a worker thread; the loop went on ticking meanwhile.
    assert ticks >= 10


async def test_no_reading_at_all_is_null_with_a_note_not_an_error(tmp_path: Path) -> None:
    probe = HardwareProbe(meminfo_path=tmp_path / "absent", nvidia_smi=None, find_nvidia_smi=False)
    hardware = await probe.read()
    assert hardware["memory"] is None
    assert "does not exist" in hardware["note"]


async def test_readings_are_cached_and_shared_by_concurrent_readers(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    smi = script(tmp_path, "smi", f'echo run >> "{runs}"; sleep 0.2; echo "4096, 1024"')
    probe = HardwareProbe(meminfo_path=meminfo_file(tmp_path), nvidia_smi=smi, cache_secs=60)
    answers = await asyncio.gather(*(probe.read() for _ in range(5)))
    assert all(a["memory"]["total_bytes"] == 4 * GIB for a in answers)
    await probe.read()
    assert runs.read_text().count("run") == 1
    # Each caller gets its own copy: changing one answer does not change the cache.
    answers[0]["memory"]["used_bytes"] = -1
    assert (await probe.read())["memory"]["used_bytes"] == GIB


async def test_a_stale_reading_is_taken_again(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    smi = script(tmp_path, "smi", f'echo run >> "{runs}"; echo "4096, 1024"')
    probe = HardwareProbe(meminfo_path=meminfo_file(tmp_path), nvidia_smi=smi, cache_secs=0)
    await probe.read()
    await probe.read()
    assert runs.read_text().count("run") == 2


# -- files below the roots -----------------------------------------------------------------


def touch(path: Path, size: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def listed(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["root"], e["path"]) for e in doc["entries"]]


def test_files_are_listed_relative_to_their_root_with_size_and_mtime(tmp_path: Path) -> None:
    root = tmp_path / "models"
    big = touch(root / "big.gguf", 1000)
    touch(root / "vision" / "proj.gguf", 10)
    touch(root / "vision" / "deep" / "lora.safetensors", 3)
    doc = files_list(roots=[root])
    assert listed(doc) == [
        (str(root), "big.gguf"),
        (str(root), "vision/deep/lora.safetensors"),
        (str(root), "vision/proj.gguf"),
    ]
    first = doc["entries"][0]
    assert first["size"] == 1000 and first["mtime"] == big.stat().st_mtime
    assert doc["truncated"] is False
    assert doc["roots"] == [{"path": str(root), "note": ""}]


def test_symlinks_never_lead_out_of_the_root(tmp_path: Path) -> None:
    root = tmp_path / "models"
    touch(root / "real.gguf")
    secret = touch(tmp_path / "outside" / "secret.key")
    touch(tmp_path / "outside" / "more" / "other.gguf")
    (root / "escape.gguf").symlink_to(secret)
    (root / "relative-escape").symlink_to("../outside/secret.key")
    (root / "outdir").symlink_to(tmp_path / "outside", target_is_directory=True)
    (root / "alias.gguf").symlink_to(root / "real.gguf")
    (root / "loop").symlink_to(root, target_is_directory=True)
    (root / "broken").symlink_to(tmp_path / "nowhere")
    (root / "dangling").symlink_to(root / "gone.gguf")
    doc = files_list(roots=[root])
    # A file link that stays inside is listed; links out, directory links and dangling ones
    # are not.
    assert [path for _, path in listed(doc)] == ["alias.gguf", "real.gguf"]
    assert "secret" not in repr(doc) and "other.gguf" not in repr(doc)
    # The dangling link inside the root is the one entry that could not be read.
    assert doc["roots"] == [{"path": str(root), "note": "1 entry could not be read"}]


def test_the_listing_stops_at_its_cap_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for index in range(12):
        touch(root / f"f{index:02d}.bin")
    doc = files_list(roots=[root], max_files=5)
    assert [path for _, path in listed(doc)] == [f"f{i:02d}.bin" for i in range(5)]
    assert doc["truncated"] is True
    exact = files_list(roots=[root], max_files=12)
    assert len(listed(exact)) == 12 and exact["truncated"] is False


def test_the_cap_spans_every_root_and_later_roots_say_they_were_not_listed(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for index in range(3):
        touch(first / f"{index}.bin")
        touch(second / f"{index}.bin")
    doc = files_list(roots=[first, second], max_files=2)
    assert listed(doc) == [(str(first), "0.bin"), (str(first), "1.bin")]
    assert doc["truncated"] is True
    assert doc["roots"][1] == {
        "path": str(second),
        "note": "not listed: the listing was already full",
    }


def test_the_walk_itself_is_bounded(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for index in range(20):
        (root / f"empty{index:02d}").mkdir(parents=True)
    touch(root / "zz.bin")
    doc = files_list(roots=[root], max_visited=10)
    assert listed(doc) == [] and doc["truncated"] is True


def test_long_paths_are_capped_in_bytes_too(tmp_path: Path) -> None:
    root = tmp_path / "models"
    for index in range(4):
        touch(root / (f"{index}" + "n" * 100))
    doc = files_list(roots=[root], max_path_bytes=250)
    assert len(listed(doc)) == 2 and doc["truncated"] is True


def test_missing_and_nested_roots_are_noted_and_nothing_is_listed_twice(tmp_path: Path) -> None:
    outer = tmp_path / "models"
    touch(outer / "inner" / "x.bin")
    touch(tmp_path / "file.bin")
    roots = [outer / "inner", outer, tmp_path / "absent", tmp_path / "file.bin", outer]
    doc = files_list(roots=roots)
    assert listed(doc) == [(str(outer), "inner/x.bin")]
    assert [r["note"] for r in doc["roots"]] == [
        f"listed under {outer}",
        "",
        "not listed: does not exist",
        "not listed: not a directory",
        f"listed under {outer}",
    ]


def test_no_roots_list_nothing(tmp_path: Path) -> None:
    assert files_list(roots=[]) == {"roots": [], "entries": [], "truncated": False}


# -- small parts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), ("true", True), ("TRUE", True), ("1", True), ("false", False), ("0", False)],
)
def test_include_files_takes_true_or_false(value: str | None, expected: bool) -> None:
    assert include_files_parse(value) is expected


@pytest.mark.parametrize("value", ["", "yes", "2"])
def test_any_other_include_files_is_a_400_naming_it(value: str) -> None:
    with pytest.raises(RouterError) as caught:
        include_files_parse(value)
    assert (caught.value.status, caught.value.param) == (400, "include_files")


def test_a_recipe_reached_by_two_public_ids_is_listed_once() -> None:
    text = Component("text", "w1", "words", "", "words.kcpps")
    image = Component("image", "w2", "", "paint", "paint.kcpps")
    recipe = Recipe("combo", "combo", "combo-image", {"image": image, "text": text})
    doc = recipes_doc({"combo": recipe, "combo-image": recipe})
    assert [r["id"] for r in doc] == ["combo"]
    assert [c["kind"] for c in doc[0]["components"]] == ["text", "image"]
    assert doc[0]["components"][1] == {
        "kind": "image",
        "node_id": "w2",
        "model_id": "",
        "image_id": "paint",
        "config_filename": "paint.kcpps",
    }
