"""Cost-fit speed: how long one node's refit takes for 10 000 samples per model.

Fits synthetic text samples (prefill + decode terms, with noise) and image samples (one
term, with noise) with ``fit_durations``, and text samples with ``token_profile``; reports
the median of R runs of each. Every node refits on every refresh tick, so this must stay
small next to a request's own overhead.

Prints a table and, last, one JSON line. Run: `.venv/bin/python bench/fits.py [--n 10000]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

# Run as a script, bench/ is first on sys.path, and bench/queue.py would shadow the standard
# library's `queue`: swap that entry for the repository root.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# ruff: noqa: E402  (imports below need the path fix above)

from analytics.fitting import fit_durations, token_profile

TARGET_MS = 20
DEFAULT_SAMPLES = 10_000
DEFAULT_RUNS = 20
MIN_SAMPLES = 20
SEED = 20250601


def median_ms(action: Callable[[], object], runs: int) -> float:
    action()  # warm-up: first call pays numpy's lazy set-up
    times: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=DEFAULT_SAMPLES, help="samples per fit")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="timed runs per fit")
    args = parser.parse_args()
    n: int = args.n
    runs: int = args.runs
    rng = np.random.default_rng(SEED)

    prompt = rng.integers(10, 8000, n).astype(float)
    output = rng.integers(1, 1000, n).astype(float)
    text_work = np.column_stack([prompt, output])
    text_ms = 40.0 + 0.5 * prompt + 20.0 * output + rng.normal(0.0, 25.0, n)

    sizes = rng.choice([512 * 512, 768 * 768, 1024 * 1024, 1024 * 768], n)
    steps = rng.integers(4, 50, n)
    counts = rng.integers(1, 5, n)
    image_work = (sizes * steps * counts).astype(float).reshape(-1, 1)
    image_ms = 500.0 + 0.001 * image_work[:, 0] + rng.normal(0.0, 50.0, n)

    prompt_bytes = np.round(prompt * rng.normal(4.0, 0.4, n)).clip(min=1)

    text_fit = fit_durations(text_work, text_ms, min_samples=MIN_SAMPLES)
    image_fit = fit_durations(image_work, image_ms, min_samples=MIN_SAMPLES)
    profile = token_profile(prompt_bytes, prompt, output, min_samples=MIN_SAMPLES)
    if text_fit is None or image_fit is None or profile is None:
        print("a fit came out unpriced: the synthetic data is wrong", file=sys.stderr)
        return 1

    text_fit_ms = median_ms(
        lambda: fit_durations(text_work, text_ms, min_samples=MIN_SAMPLES), runs
    )
    image_fit_ms = median_ms(
        lambda: fit_durations(image_work, image_ms, min_samples=MIN_SAMPLES), runs
    )
    token_ms = median_ms(
        lambda: token_profile(prompt_bytes, prompt, output, min_samples=MIN_SAMPLES), runs
    )
    passed = max(text_fit_ms, image_fit_ms, token_ms) <= TARGET_MS

    print(f"samples per fit: {n}, median of {runs} runs, target <= {TARGET_MS:.0f} ms")
    print(f"{'what':<16}{'median ms':>12}  result")
    print(
        f"{'text fit':<16}{text_fit_ms:>12.3f}  base {text_fit.base_ms:.2f} ms, "
        f"slopes {text_fit.slopes_ms[0]:.4f} / {text_fit.slopes_ms[1]:.4f} ms per token "
        f"(true 40 + 0.5 p + 20 o)"
    )
    print(
        f"{'image fit':<16}{image_fit_ms:>12.3f}  base {image_fit.base_ms:.2f} ms, "
        f"slope {image_fit.slopes_ms[0]:.6f} ms per unit (true 500 + 0.001 w)"
    )
    print(
        f"{'token profile':<16}{token_ms:>12.3f}  "
        f"{profile.conservative_bytes_per_token:.3f} bytes/token, "
        f"{profile.reserved_output_tokens:.0f} output tokens reserved"
    )
    print(
        json.dumps(
            {
                "bench": "fits",
                "samples": n,
                "text_fit_ms": round(text_fit_ms, 4),
                "image_fit_ms": round(image_fit_ms, 4),
                "token_profile_ms": round(token_ms, 4),
                "target_ms": TARGET_MS,
                "pass": passed,
            }
        )
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
