"""Cost fits for backlog lending: what a job, a queue and a model load cost on this node.

Pure numpy, no Django: ``analytics.costs`` feeds it rows from the database, the lending
planner consumes the results (possibly from another node, through the wire form).

A duration fit is ``duration_ms = base + sum(slope_i * work_i)``, with one work term for
images (pixels * steps * count) and two for text (prompt tokens, output tokens). The rules
(minimum samples, spread test, uniform case, mixed case, collinearity) follow the reference
router so that prices match across a mixed cluster; see reference-lending.md section 2.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "SECTION_IMAGE",
    "SECTION_LLM",
    "CostFit",
    "TokenProfile",
    "fit_durations",
    "fits_from_wire",
    "fits_to_wire",
    "load_costs",
    "token_profile",
]

SECTION_IMAGE = "image"
SECTION_LLM = "llm"
_SECTIONS = frozenset({SECTION_IMAGE, SECTION_LLM})

# A fit needs at least two points whatever the setting says: one point has no spread.
MIN_FIT_SAMPLES_FLOOR = 2
# A work term counts as varying when its coefficient of variation reaches 5 %:
# sqrt(n*sum(x^2) - sum(x)^2) / sum(x) >= 0.05.
SPREAD_MIN_RATIO = 0.05
# A uniform fit prices only work within twice the spread threshold of the mean it saw.
UNIFORM_TOLERANCE_RATIO = 2 * SPREAD_MIN_RATIO
# ...or within this many tokens of it, whichever is wider. Ten per cent of a short prompt or
# answer is a token or two: a template whose answers differ by three tokens, or a body the
# master re-serialised on the way to a helper, must not fall outside the fit. Image work
# (pixels x steps) has no such floor: a different size or step count is different work.
TEXT_MATCH_FLOOR_TOKENS = 16.0
MATCH_FLOOR_BY_SECTION: Mapping[str, float] = {"llm": TEXT_MATCH_FLOOR_TOKENS, "image": 0.0}
# A pivot this small relative to the largest normal-equation entry means the terms are
# (nearly) linear combinations of each other: their separate slopes are meaningless.
COLLINEAR_PIVOT_RATIO = 1e-9
MAX_WORK_TERMS = 2
# A term that varied but whose fitted slope came out negative is noise when its effect over
# the whole range it spanned (|slope| x (max - min)) stays within this share of the mean
# duration: a streamed body a few bytes longer than a plain one must not unprice a model
# whose prompt costs nothing measurable. Such a term is treated as if it had not varied.
NOISE_EFFECT_RATIO = 0.05
# ...or when it lies within this many standard errors of zero: the fit's own scatter cannot
# tell it from no slope at all. The effect share alone judged a slope against the mean
# duration, not against how scattered the durations were: on a loaded machine plain requests
# ~10 ms slower than a few streamed ones 13 prompt tokens longer read as "clearly negative"
# and unpriced a model. 2.0 is about the two-sided 95 % bound of a normal error (1.96), the
# same two sigmas as TOKEN_SPREAD_SIGMAS; with few rows a Student t bound would be wider
# (2.45 at 6 degrees of freedom), so there 2.0 errs towards withdrawing the fit, as the
# effect share alone did, rather than towards pricing work that seems to make jobs faster.
NOISE_SLOPE_STANDARD_ERRORS = 2.0

# A token ratio outside this range (bytes per token) means the samples are not text
# tokenised by a normal tokenizer, so no size estimate is better than a wild one.
MIN_BYTES_PER_TOKEN = 0.5
MAX_BYTES_PER_TOKEN = 64.0
# How many standard deviations the estimate is pulled towards "more tokens" / "longer answer".
TOKEN_SPREAD_SIGMAS = 2.0
# A line of tokens against bytes needs a third point to have any scatter to measure.
LINE_MIN_SAMPLES = 3


@dataclass(frozen=True)
class CostFit:
    """One model's duration fit on one node (milliseconds)."""

    base_ms: float
    slopes_ms: tuple[float, ...]
    samples: int
    # Set only when every sample did (nearly) the same work: then the fit knows the price of
    # that work and nothing else.
    uniform_work: tuple[float, ...] | None = None
    # Set when some terms varied and others did not (a template: one prompt, answers of many
    # lengths). The varying terms are fitted; a constant term's cost is inside the base, so
    # the fit prices only work whose constant terms match the mean it saw (None: fitted).
    constant_work: tuple[float | None, ...] | None = None
    # Absolute slack of the match beside the relative one (MATCH_FLOOR_BY_SECTION).
    match_floor: float = 0.0

    def _matches(self, value: float, mean: float) -> bool:
        return abs(value - mean) <= max(UNIFORM_TOLERANCE_RATIO * mean, self.match_floor)

    def _uniform_matches(self, work: Sequence[float]) -> bool:
        if self.uniform_work is not None:
            return all(
                self._matches(w, mean) for w, mean in zip(work, self.uniform_work, strict=True)
            )
        if self.constant_work is not None:
            return all(
                mean is None or self._matches(w, mean)
                for w, mean in zip(work, self.constant_work, strict=True)
            )
        return True

    def _usable_work(self, work: Sequence[float]) -> tuple[float, ...] | None:
        if len(work) == 0 or len(work) != len(self.slopes_ms):
            return None
        values = tuple(float(w) for w in work)
        if not all(math.isfinite(w) for w in values):
            return None
        return values

    def predict(self, work: Sequence[float]) -> float | None:
        """Duration of one job of ``work``; None when this fit cannot price it."""
        values = self._usable_work(work)
        if values is None:
            return None
        if self.uniform_work is not None:
            return self.base_ms if self._uniform_matches(values) else None
        if not self._uniform_matches(values):
            return None
        return self.base_ms + sum(
            slope * max(w, 0.0) for slope, w in zip(self.slopes_ms, values, strict=True)
        )

    def queue_price(self, count: int, total_work: Sequence[float]) -> float | None:
        """Time to drain ``count`` jobs whose work adds up to ``total_work``; None = unpriced."""
        if count <= 0:
            return 0.0
        values = self._usable_work(total_work)
        if values is None:
            return None
        if self.uniform_work is not None or self.constant_work is not None:
            mean_work = tuple(w / count for w in values)
            if not self._uniform_matches(mean_work):
                return None
        if self.uniform_work is not None:
            return count * self.base_ms
        return count * self.base_ms + sum(
            slope * max(w, 0.0) for slope, w in zip(self.slopes_ms, values, strict=True)
        )


def _clean_rows(work: np.ndarray, durations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(work, dtype=np.float64)
    if x.ndim == 1:
        x = x.reshape(-1, 1)
    y = np.asarray(durations, dtype=np.float64).reshape(-1)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"work shape {x.shape} does not match durations shape {y.shape}")
    # Rows without a measurable size or time say nothing about cost; negative or non-finite
    # values can only come from a broken record.
    keep = (
        np.isfinite(y)
        & (y > 0)
        & np.isfinite(x).all(axis=1)
        & (x >= 0).all(axis=1)
        & (x > 0).any(axis=1)
    )
    return x[keep], y[keep]


def _measurable(n: int, column: np.ndarray) -> bool:
    total = float(column.sum())
    if not math.isfinite(total) or total <= 0:
        return False
    # n*sum(x^2) - sum(x)^2 == n*sum((x - mean)^2); the centred form does not cancel away
    # the spread of large work values (image pixels*steps reach 1e8 and more).
    centred = column - total / n
    spread = n * float(centred @ centred)
    if not math.isfinite(spread) or spread <= 0:
        return False
    return spread >= (SPREAD_MIN_RATIO * total) ** 2


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when the system is (near) singular."""
    size = len(rhs)
    a = [[*row, value] for row, value in zip(matrix, rhs, strict=True)]
    largest = max(abs(value) for row in matrix for value in row)
    if not math.isfinite(largest) or largest <= 0:
        return None
    min_pivot = COLLINEAR_PIVOT_RATIO * largest
    for col in range(size):
        pivot_row = max(range(col, size), key=lambda r: abs(a[r][col]))
        if abs(a[pivot_row][col]) < min_pivot:
            return None
        a[col], a[pivot_row] = a[pivot_row], a[col]
        pivot = a[col][col]
        for r in range(col + 1, size):
            factor = a[r][col] / pivot
            if factor:
                for c in range(col, size + 1):
                    a[r][c] -= factor * a[col][c]
    solution = [0.0] * size
    for r in range(size - 1, -1, -1):
        acc = a[r][size] - sum(a[r][c] * solution[c] for c in range(r + 1, size))
        solution[r] = acc / a[r][r]
    return solution


def fit_durations(
    work: np.ndarray, durations: np.ndarray, *, min_samples: int, match_floor: float = 0.0
) -> CostFit | None:
    """Fit ``duration = base + slopes . work`` by least squares; None = unpriced.

    ``work`` has shape (n, k), k = 1 (image) or 2 (text). See reference-lending.md 2.2;
    unlike the reference, a fit whose terms partly vary prices work that matches its
    constant terms instead of nothing (``CostFit.constant_work``), and a term whose negative
    slope is within noise joins those constant terms instead of unpricing the model.
    ``match_floor`` is the absolute slack of that match (and of a uniform fit's).
    """
    x, y = _clean_rows(work, durations)
    n, terms = x.shape
    if terms == 0 or terms > MAX_WORK_TERMS:
        return None
    if n < max(MIN_FIT_SAMPLES_FLOOR, min_samples):
        return None

    measurable = [_measurable(n, x[:, i]) for i in range(terms)]
    means = tuple(float(v) for v in x.mean(axis=0))
    if not any(measurable):
        return CostFit(
            base_ms=float(y.mean()),
            slopes_ms=(0.0,) * terms,
            samples=n,
            uniform_work=means,
            match_floor=match_floor,
        )

    return _fit_varying(x, y, measurable, means, match_floor)


def _fit_varying(
    x: np.ndarray,
    y: np.ndarray,
    measurable: Sequence[bool],
    means: tuple[float, ...],
    match_floor: float,
) -> CostFit | None:
    """Least squares over the terms that varied; the others become a matching condition.

    Unlike the reference, a negative slope does not unprice the model when its term is noise:
    its effect over the range it spanned is within ``NOISE_EFFECT_RATIO`` of the mean
    duration, or the slope is within ``NOISE_SLOPE_STANDARD_ERRORS`` standard errors of zero
    (``_slope_errors``; with no degrees of freedom left only the effect counts). That term
    joins the constant ones and the rest is fitted again. A slope outside both (work that
    clearly makes jobs faster, a broken measurement) still unprices the model.
    """
    n, terms = x.shape
    # Only the varying terms are regressors: a constant term cannot be told apart from the
    # base, so its cost stays in the base and it becomes a condition on what is priced.
    varying = [i for i in range(terms) if measurable[i]]
    mean_duration = float(y.mean())
    while True:
        solved = _least_squares(x[:, varying], y)
        if solved is None:
            return None
        base, fitted = solved
        noise = _noise_terms(x, y, varying, base, fitted, mean_duration)
        if any(slope < 0 for slope in fitted) and not noise:
            return None
        if not noise:
            break
        varying = [i for i in varying if i not in noise]
        if not varying:
            return CostFit(
                base_ms=mean_duration,
                slopes_ms=(0.0,) * terms,
                samples=n,
                uniform_work=means,
                match_floor=match_floor,
            )
    slopes = [0.0] * terms
    for j, i in enumerate(varying):
        slopes[i] = fitted[j]
    constant: tuple[float | None, ...] | None = None
    if len(varying) < terms:
        constant = tuple(means[i] if i not in varying else None for i in range(terms))
    return CostFit(
        base_ms=max(base, 0.0),
        slopes_ms=tuple(slopes),
        samples=n,
        constant_work=constant,
        match_floor=match_floor,
    )


def _noise_terms(
    x: np.ndarray,
    y: np.ndarray,
    varying: Sequence[int],
    base: float,
    fitted: Sequence[float],
    mean_duration: float,
) -> list[int]:
    """The terms of ``varying`` whose negative slope is noise (see ``_fit_varying``)."""
    if all(slope >= 0 for slope in fitted):
        return []  # the usual case: no residual pass, no inverse
    errors = _slope_errors(x[:, varying], y, base, fitted)
    effect_limit = NOISE_EFFECT_RATIO * mean_duration
    noise: list[int] = []
    for j, (i, slope) in enumerate(zip(varying, fitted, strict=True)):
        if slope >= 0:
            continue
        small = -slope * float(np.ptp(x[:, i])) <= effect_limit
        # Without a scatter estimate (no degrees of freedom) the effect share is the only test.
        unclear = errors is not None and -slope <= NOISE_SLOPE_STANDARD_ERRORS * errors[j]
        if small or unclear:
            noise.append(i)
    return noise


def _slope_errors(
    xv: np.ndarray, y: np.ndarray, base: float, fitted: Sequence[float]
) -> list[float] | None:
    """Standard error of each slope of ``y = base + fitted . xv``; None = no scatter estimate.

    The residual variance is s^2 = RSS / (n - p), p counting the base; a slope's variance is
    the diagonal of s^2 (D^T D)^-1 over the design D = [1, xv / mean] that ``_least_squares``
    solves, divided by the square of the term's mean to undo that scaling. The slopes' block
    of that inverse is the inverse of the centred columns' own Gram matrix (the partitioned
    inverse), which is used instead: centring keeps the ones column from cancelling away the
    spread, as in ``_measurable``. None when n <= p or the numbers are not finite.
    """
    n, terms = xv.shape
    freedom = n - (terms + 1)
    if freedom <= 0:
        return None
    residuals = y - base - xv @ np.asarray(fitted, dtype=np.float64)
    variance = float(residuals @ residuals) / freedom
    scale = xv.mean(axis=0)
    scaled = xv / scale
    centred = scaled - scaled.mean(axis=0)
    try:
        inverse = np.linalg.inv(centred.T @ centred)
    except np.linalg.LinAlgError:
        return None
    errors: list[float] = []
    for j in range(terms):
        slope_variance = variance * float(inverse[j, j]) / float(scale[j]) ** 2
        if not math.isfinite(slope_variance) or slope_variance < 0:
            return None
        errors.append(math.sqrt(slope_variance))
    return errors


def _least_squares(xv: np.ndarray, y: np.ndarray) -> tuple[float, list[float]] | None:
    """``(base, slopes)`` of ``y = base + slopes . xv``; None when singular or not finite."""
    n = xv.shape[0]
    # Each term is divided by its mean before forming the normal equations, so the
    # collinearity threshold compares like with like instead of pixels*steps against a count.
    scale = xv.mean(axis=0)
    design = np.empty((n, xv.shape[1] + 1), dtype=np.float64)
    design[:, 0] = 1.0
    design[:, 1:] = xv / scale
    gram = design.T @ design
    moments = design.T @ y
    if not (np.isfinite(gram).all() and np.isfinite(moments).all()):
        return None
    solution = _solve(gram.tolist(), moments.tolist())
    if solution is None:
        return None
    base = solution[0]
    fitted = [float(s / scale[j]) for j, s in enumerate(solution[1:])]
    if not math.isfinite(base) or not all(math.isfinite(s) for s in fitted):
        return None
    return base, fitted


def load_costs(rows: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Mean load time per config file from ``(config_filename, duration_ms)`` rows."""
    totals: dict[str, list[float]] = {}
    for name, duration in rows:
        value = float(duration)
        if not name or not math.isfinite(value) or value <= 0:
            continue
        acc = totals.setdefault(name, [0.0, 0.0])
        acc[0] += value
        acc[1] += 1.0
    return {name: acc[0] / acc[1] for name, acc in totals.items()}


@dataclass(frozen=True)
class TokenProfile:
    """How a text model's raw request bytes turn into tokens, measured from its traffic."""

    conservative_bytes_per_token: float
    reserved_output_tokens: float
    samples: int
    # The unbiased ratio and answer length: what pricing needs, since a fit is in measured
    # tokens. 0 means "not known" (a node on an older build): the conservative values stand in.
    mean_bytes_per_token: float = 0.0
    mean_output: float = 0.0
    # The straight line tokens = (bytes - overhead_bytes) / bytes_per_token that the traffic
    # follows: a body carries JSON that is no prompt (overhead > 0) and a chat template adds
    # tokens the body does not hold (overhead < 0). 0 from a node on an older build.
    overhead_bytes: float = 0.0
    # How far measured prompts lay above that line (2 sigma, tokens): the conservative
    # estimate adds it instead of pulling the ratio down, so a short prompt is over-counted by
    # a few tokens rather than many times over. 0 when no line was fitted.
    spread_tokens: float = 0.0

    def _line_tokens(self, body_bytes: int, ratio: float) -> float:
        return (float(body_bytes) - self.overhead_bytes) / ratio

    def prompt_tokens(self, body_bytes: int) -> int:
        """Estimated prompt tokens of a raw request body (rounded up, errs towards more)."""
        if body_bytes <= 0:
            return 0
        line = self._line_tokens(body_bytes, self.conservative_bytes_per_token)
        # Rounded first so that a fitted line's last-bit error never adds a whole token.
        return max(1, math.ceil(round(line + self.spread_tokens, 6)))

    def expected_prompt_tokens(self, body_bytes: int) -> int:
        """Prompt tokens a raw body most likely holds: what the backend will measure."""
        if body_bytes <= 0:
            return 0
        ratio = self.mean_bytes_per_token or self.conservative_bytes_per_token
        return max(1, round(self._line_tokens(body_bytes, ratio)))

    @property
    def mean_output_tokens(self) -> float:
        """The usual answer length, for pricing a request that states no max_tokens."""
        return self.mean_output or self.reserved_output_tokens

    def required_context(self, body_bytes: int, max_tokens: int | None, floor: int) -> int:
        """Context window a request needs: estimated prompt plus room for the answer.

        ``floor`` (scheduling_context_reserve) only applies when the client stated no
        ``max_tokens``: a client that asks for a short answer needs no more room than that
        and the measured history.
        """
        answer = max(
            self.reserved_output_tokens,
            float(max_tokens or 0),
            float(floor) if max_tokens is None else 0.0,
        )
        return self.prompt_tokens(body_bytes) + math.ceil(answer)


def _token_line(body_bytes: np.ndarray, tokens: np.ndarray) -> tuple[float, float, float] | None:
    """(overhead bytes, bytes per token, 2-sigma spread in tokens) of tokens against bytes.

    A body is its prompt plus JSON that is no prompt (model, keys, max_tokens), and a chat
    template adds tokens the body does not hold. On short prompts those fixed parts dominate:
    measured on llama-server, "Hi" was 46 bytes and 2 tokens as a completion but 76 bytes and
    25 tokens as a chat, so the plain ratio spreads from 1.8 to 23 bytes per token and its
    conservative end (mean - 2 sigma) sits at the floor, estimating every prompt at several
    times its tokens. A straight line through (bytes, tokens) takes the fixed parts as its
    intercept; the scatter around it becomes an additive margin. None when the byte sizes do
    not vary enough to draw a line, or the line's slope is no tokenizer's.
    """
    n = tokens.shape[0]
    if n < LINE_MIN_SAMPLES or not _measurable(n, body_bytes):
        return None
    design = np.column_stack([np.ones(n), body_bytes])
    (intercept, slope), *_ = np.linalg.lstsq(design, tokens, rcond=None)
    if not (math.isfinite(intercept) and math.isfinite(slope)) or slope <= 0:
        return None
    bytes_per_token = 1.0 / float(slope)
    if not (MIN_BYTES_PER_TOKEN <= bytes_per_token <= MAX_BYTES_PER_TOKEN):
        return None
    residuals = tokens - (intercept + slope * body_bytes)
    spread = TOKEN_SPREAD_SIGMAS * float(residuals.std())
    return -float(intercept) * bytes_per_token, bytes_per_token, spread


def token_profile(
    prompt_bytes: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    *,
    min_samples: int,
) -> TokenProfile | None:
    """Bytes-per-token ratio and answer length of one model; None = no size estimate."""
    b = np.asarray(prompt_bytes, dtype=np.float64).reshape(-1)
    i = np.asarray(input_tokens, dtype=np.float64).reshape(-1)
    o = np.asarray(output_tokens, dtype=np.float64).reshape(-1)
    if not (b.shape == i.shape == o.shape):
        raise ValueError(f"column lengths differ: {b.shape}, {i.shape}, {o.shape}")
    keep = np.isfinite(b) & np.isfinite(i) & np.isfinite(o) & (b > 0) & (i > 0) & (o > 0)
    n = int(keep.sum())
    if n < max(1, min_samples):
        return None
    ratio = b[keep] / i[keep]
    mean_ratio = float(ratio.mean())
    if not (MIN_BYTES_PER_TOKEN <= mean_ratio <= MAX_BYTES_PER_TOKEN):
        return None
    conservative = max(MIN_BYTES_PER_TOKEN, mean_ratio - TOKEN_SPREAD_SIGMAS * float(ratio.std()))
    overhead, spread = 0.0, 0.0
    line = _token_line(b[keep], i[keep])
    if line is not None:
        overhead, mean_ratio, spread = line
        conservative = mean_ratio
    out = o[keep]
    mean_out = float(out.mean())
    reserved = mean_out + TOKEN_SPREAD_SIGMAS * float(out.std())
    if not math.isfinite(reserved):
        reserved = mean_out
    return TokenProfile(
        conservative_bytes_per_token=conservative,
        reserved_output_tokens=reserved,
        samples=n,
        mean_bytes_per_token=mean_ratio,
        mean_output=mean_out,
        overhead_bytes=overhead,
        spread_tokens=spread,
    )


# --- wire form (runtime status ``costs``) -------------------------------------------------


def fits_to_wire(
    models: Mapping[tuple[str, str], CostFit],
    loads: Mapping[str, float],
    tokens: Mapping[str, TokenProfile],
) -> dict[str, Any]:
    """The ``costs`` object a node publishes in its runtime status (sorted, so stable)."""
    model_rows: list[dict[str, Any]] = []
    for (model_id, section), fit in sorted(models.items()):
        row: dict[str, Any] = {
            "model_id": model_id,
            "section": section,
            "base_ms": fit.base_ms,
            "slopes_ms": list(fit.slopes_ms),
            "samples": fit.samples,
        }
        if fit.uniform_work is not None:
            row["uniform_work"] = list(fit.uniform_work)
        if fit.constant_work is not None:
            row["constant_work"] = list(fit.constant_work)
        model_rows.append(row)
    return {
        "models": model_rows,
        "loads": [
            {"config_filename": name, "load_ms": load_ms} for name, load_ms in sorted(loads.items())
        ],
        "tokens": [
            {
                "model_id": model_id,
                "conservative_bytes_per_token": profile.conservative_bytes_per_token,
                "reserved_output_tokens": profile.reserved_output_tokens,
                "samples": profile.samples,
                "mean_bytes_per_token": profile.mean_bytes_per_token,
                "mean_output_tokens": profile.mean_output,
                "overhead_bytes": profile.overhead_bytes,
                "spread_tokens": profile.spread_tokens,
            }
            for model_id, profile in sorted(tokens.items())
        ],
    }


def _number(value: object) -> float | None:
    # bool is an int subclass, but true/false is never a measurement.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    result = float(value)
    return result if math.isfinite(result) else None


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _numbers(value: object) -> tuple[float, ...] | None:
    if not isinstance(value, list):
        return None
    result = tuple(_number(item) for item in value)
    if any(item is None for item in result):
        return None
    return tuple(item for item in result if item is not None)


def _rows(doc: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
    rows = doc.get(name)
    if not isinstance(rows, list):
        return []
    return [row for row in rows if isinstance(row, Mapping)]


class _Malformed(ValueError):
    """A published fit row that cannot be read safely: the model stays unpriced."""


def _uniform_from_wire(row: Mapping[str, Any], terms: int) -> tuple[float, ...] | None:
    if row.get("uniform_work") is None:
        return None
    uniform = _numbers(row["uniform_work"])
    # A uniform fit read without its work would price every size at its mean: better to leave
    # the model unpriced than to misprice it.
    if uniform is None or len(uniform) != terms or any(w < 0 for w in uniform):
        raise _Malformed("uniform_work")
    return uniform


def _constant_from_wire(row: Mapping[str, Any], terms: int) -> tuple[float | None, ...] | None:
    raw = row.get("constant_work")
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != terms:
        raise _Malformed("constant_work")
    parsed = tuple(None if item is None else _number(item) for item in raw)
    # Same reasoning as for uniform_work: without its condition the fit would misprice.
    for item, value in zip(raw, parsed, strict=True):
        if (item is None) != (value is None) or (value is not None and value < 0):
            raise _Malformed("constant_work")
    return parsed


def _model_from_wire(row: Mapping[str, Any]) -> tuple[tuple[str, str], CostFit] | None:
    model_id = row.get("model_id")
    section = row.get("section")
    base = _number(row.get("base_ms"))
    slopes = _numbers(row.get("slopes_ms"))
    samples = _count(row.get("samples"))
    if not isinstance(model_id, str) or not model_id or not isinstance(section, str):
        return None
    if section not in _SECTIONS or base is None or base < 0 or samples is None:
        return None
    if slopes is None or not 1 <= len(slopes) <= MAX_WORK_TERMS or any(s < 0 for s in slopes):
        return None
    try:
        uniform = _uniform_from_wire(row, len(slopes))
        constant = None if uniform is not None else _constant_from_wire(row, len(slopes))
    except _Malformed:
        return None
    fit = CostFit(
        base_ms=base,
        slopes_ms=slopes,
        samples=samples,
        uniform_work=uniform,
        constant_work=constant,
        match_floor=MATCH_FLOOR_BY_SECTION.get(section, 0.0),
    )
    return (model_id, section), fit


def fits_from_wire(
    doc: object,
) -> tuple[dict[tuple[str, str], CostFit], dict[str, float], dict[str, TokenProfile]]:
    """Read another node's ``costs`` object; malformed rows are skipped, never fatal."""
    models: dict[tuple[str, str], CostFit] = {}
    loads: dict[str, float] = {}
    tokens: dict[str, TokenProfile] = {}
    if not isinstance(doc, Mapping):
        return models, loads, tokens

    for row in _rows(doc, "models"):
        parsed = _model_from_wire(row)
        if parsed is not None:
            models[parsed[0]] = parsed[1]

    for row in _rows(doc, "loads"):
        name = row.get("config_filename")
        load_ms = _number(row.get("load_ms"))
        if isinstance(name, str) and name and load_ms is not None and load_ms > 0:
            loads[name] = load_ms

    for row in _rows(doc, "tokens"):
        token_row = _token_profile_from_wire(row)
        if token_row is not None:
            tokens[token_row[0]] = token_row[1]
    return models, loads, tokens


def _positive_or_zero(value: object) -> float:
    number = _number(value)
    return number if number is not None and number > 0 else 0.0


def _token_profile_from_wire(row: Mapping[str, Any]) -> tuple[str, TokenProfile] | None:
    model_id = row.get("model_id")
    bpt = _number(row.get("conservative_bytes_per_token"))
    reserved = _number(row.get("reserved_output_tokens"))
    samples = _count(row.get("samples"))
    if not isinstance(model_id, str) or not model_id or samples is None:
        return None
    if bpt is None or bpt <= 0 or reserved is None or reserved < 0:
        return None
    # Older builds publish no means: 0 lets the conservative values stand in.
    return model_id, TokenProfile(
        conservative_bytes_per_token=bpt,
        reserved_output_tokens=reserved,
        samples=samples,
        mean_bytes_per_token=_positive_or_zero(row.get("mean_bytes_per_token")),
        mean_output=_positive_or_zero(row.get("mean_output_tokens")),
        overhead_bytes=_number(row.get("overhead_bytes")) or 0.0,
        spread_tokens=_positive_or_zero(row.get("spread_tokens")),
    )
