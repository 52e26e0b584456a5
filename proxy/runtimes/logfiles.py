"""Size-bounded output files of the backends and the workers.

Those processes write to their file through a descriptor opened in append mode, which the
router cannot swap under them; so a file over the limit is copied to `.1` (older copies shift
to `.2` … `.<backups>`, the oldest is dropped) and then truncated in place. Appends after the
truncation land at the new end of the file, so nothing the process writes later is lost; lines
written between the copy and the truncation are (the price of rotating a file another process
holds open, as logrotate's copytruncate does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

CHECK_INTERVAL_SECS = 10.0


def rotate_if_large(path: Path, max_bytes: int, backups: int) -> bool:
    """Rotate `path` when it holds more than `max_bytes`; True when it did."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size <= max_bytes:
        return False
    for index in range(backups - 1, 0, -1):
        older = path.with_name(f"{path.name}.{index}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{index + 1}"))
    shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    os.truncate(path, 0)
    return True


def rotate_dir(directory: Path, max_bytes: int, backups: int) -> list[Path]:
    rotated = []
    for path in sorted(directory.glob("*.log")):
        with contextlib.suppress(OSError):
            if rotate_if_large(path, max_bytes, backups):
                rotated.append(path)
    return rotated


async def keep_rotating(directory: Path, max_bytes: int, backups: int) -> None:
    """Check every log file of `directory` every `CHECK_INTERVAL_SECS`, until cancelled."""
    while True:
        await asyncio.sleep(CHECK_INTERVAL_SECS)
        rotated = await asyncio.to_thread(rotate_dir, directory, max_bytes, backups)
        for path in rotated:
            logger.info("log file %s reached %d bytes: rotated", path, max_bytes)
