"""Size rotation of the backends' and workers' output files, with a writer that keeps its
append-mode descriptor open across the rotation, as a backend process does."""

from __future__ import annotations

from pathlib import Path

from proxy.runtimes.logfiles import rotate_dir, rotate_if_large


def test_a_file_at_the_limit_stays_and_one_over_it_rotates(tmp_path: Path) -> None:
    path = tmp_path / "text-backend.log"
    path.write_bytes(b"x" * 1024)
    assert rotate_if_large(path, 1024, 3) is False
    path.write_bytes(b"x" * 1025)
    assert rotate_if_large(path, 1024, 3) is True
    assert path.stat().st_size == 0
    assert (tmp_path / "text-backend.log.1").read_bytes() == b"x" * 1025


def test_an_open_append_writer_keeps_writing_to_the_fresh_file(tmp_path: Path) -> None:
    path = tmp_path / "image-backend.log"
    with open(path, "ab", buffering=0) as backend:
        backend.write(b"a" * 2000)
        assert rotate_if_large(path, 1024, 2)
        backend.write(b"after\n")
    assert path.read_bytes() == b"after\n"
    assert (tmp_path / "image-backend.log.1").read_bytes() == b"a" * 2000


def test_backups_shift_and_the_oldest_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "workers.log"
    for generation in range(4):
        path.write_bytes(str(generation).encode() * 2000)
        assert rotate_dir(tmp_path, 1024, 2) == [path]
    assert (tmp_path / "workers.log.1").read_bytes()[:1] == b"3"
    assert (tmp_path / "workers.log.2").read_bytes()[:1] == b"2"
    assert not (tmp_path / "workers.log.3").exists()
    assert rotate_dir(tmp_path, 1024, 2) == []  # the fresh file is empty
