from __future__ import annotations

import io
import struct
import wave

import pytest

from proxy.work import (
    DEFAULT_IMAGE_HEIGHT,
    DEFAULT_IMAGE_STEPS,
    DEFAULT_IMAGE_WIDTH,
    DEFAULT_MAX_TOKENS,
    ImageWork,
    image_work,
    multipart_field,
    output_tokens,
    prompt_tokens_for_bytes,
    requested_output_tokens,
    wav_duration_seconds,
    with_multipart_fields,
)

FORM = "multipart/form-data; boundary=XyZ"
PART_HEAD = b'--XyZ\r\nContent-Disposition: form-data; name="model"'
WHOLE_PART = PART_HEAD + b"\r\n\r\nm1\r\n--XyZ--"


def make_wav(seconds: float, rate: int = 8000, channels: int = 1, width: int = 2) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(width)
        writer.setframerate(rate)
        writer.writeframes(b"\x00" * int(seconds * rate) * channels * width)
    return buffer.getvalue()


def multipart(parts: list[tuple[str, bytes, str | None]], boundary: str = "XyZ") -> bytes:
    out = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        if filename is not None:
            out += b"Content-Type: application/octet-stream\r\n"
        out += b"\r\n" + value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


# prompt tokens --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_bytes", "tokens"), [(0, 0), (1, 1), (4, 1), (5, 2), (8, 2), (401, 101)]
)
def test_prompt_tokens_are_bytes_over_four_rounded_up(n_bytes: int, tokens: int) -> None:
    assert prompt_tokens_for_bytes(n_bytes) == tokens


# output tokens --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"max_tokens": 7},
        {"max_completion_tokens": 7},
        {"n_predict": 7},
        {"max_length": 7},
        {"options": {"num_predict": 7}},
    ],
)
def test_it_reads_the_output_limit_of_every_api_dialect(body: dict) -> None:
    assert requested_output_tokens(body) == 7
    assert output_tokens(body) == 7


def test_max_tokens_wins_over_the_other_spellings() -> None:
    assert requested_output_tokens({"max_tokens": 3, "max_completion_tokens": 9}) == 3


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"max_tokens": 0},
        {"max_tokens": -1},
        {"n_predict": -1},
        {"max_tokens": "12"},
        {"max_tokens": 12.5},
        {"max_tokens": True},
        {"max_tokens": None},
        {"options": "num_predict"},
        {"options": {"num_predict": 0}},
    ],
)
def test_an_absent_or_unusable_limit_means_the_default(body: dict) -> None:
    assert requested_output_tokens(body) is None
    assert output_tokens(body) == DEFAULT_MAX_TOKENS


def test_a_body_that_is_not_an_object_has_no_limit() -> None:
    assert requested_output_tokens(["max_tokens", 5]) is None  # type: ignore[arg-type]


# image work -----------------------------------------------------------------------------


def test_an_empty_image_request_gets_the_defaults() -> None:
    work = image_work({"prompt": "a cat"})
    assert work == ImageWork(DEFAULT_IMAGE_WIDTH, DEFAULT_IMAGE_HEIGHT, DEFAULT_IMAGE_STEPS, 1)


def test_openai_size_sets_width_and_height() -> None:
    work = image_work({"size": "256x128", "n": 3, "steps": 4})
    assert work == ImageWork(width=256, height=128, steps=4, n=3)
    assert work.units == 256 * 128 * 4 * 3


def test_sdapi_fields_are_understood() -> None:
    work = image_work({"width": 640, "height": 384, "steps": 10, "batch_size": 2})
    assert work == ImageWork(width=640, height=384, steps=10, n=2)


def test_sample_steps_is_an_alias_of_steps() -> None:
    assert image_work({"sample_steps": 12}).steps == 12


def test_auto_size_means_the_default_size() -> None:
    work = image_work({"size": "auto"})
    assert (work.width, work.height) == (DEFAULT_IMAGE_WIDTH, DEFAULT_IMAGE_HEIGHT)


def test_integral_floats_are_accepted() -> None:
    assert image_work({"width": 512.0}).width == 512


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"size": "big"}, "size"),
        ({"size": "512x"}, "size"),
        ({"size": "0x512"}, "size"),
        ({"size": 512}, "size"),
        ({"width": 0}, "width"),
        ({"height": -5}, "height"),
        ({"width": "512"}, "width"),
        ({"steps": 0}, "steps"),
        ({"sample_steps": 2.5}, "sample_steps"),
        ({"n": 0}, "n"),
        ({"batch_size": True}, "batch_size"),
    ],
)
def test_invalid_image_fields_raise_naming_the_field(body: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        image_work(body)


# WAV ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "rate", "channels", "width"),
    [(2.0, 8000, 1, 2), (0.5, 16000, 2, 2), (1.25, 44100, 1, 1)],
)
def test_wav_duration_comes_from_the_header(
    seconds: float, rate: int, channels: int, width: int
) -> None:
    data = make_wav(seconds, rate, channels, width)
    assert wav_duration_seconds(data) == pytest.approx(seconds, abs=1e-3)


def test_chunks_before_fmt_and_data_are_skipped() -> None:
    data = make_wav(1.0)
    # An odd-sized LIST chunk right after the RIFF header, padded to even length.
    extra = b"LIST" + struct.pack("<I", 3) + b"abc\x00"
    patched = data[:12] + extra + data[12:]
    patched = patched[:4] + struct.pack("<I", len(patched) - 8) + patched[8:]
    assert wav_duration_seconds(patched) == pytest.approx(1.0)


def test_a_truncated_data_chunk_counts_only_the_bytes_present() -> None:
    data = make_wav(2.0)
    assert wav_duration_seconds(data[: len(data) - 16000]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"ID3\x03\x00" + b"\x00" * 100,
        b"RIFF\x00\x00\x00\x00AVI LIST",
        b"RIFF\x24\x00\x00\x00WAVE",
        make_wav(1.0)[:36],
    ],
)
def test_anything_that_is_not_wav_is_rejected(data: bytes) -> None:
    with pytest.raises(ValueError, match="audio must be WAV"):
        wav_duration_seconds(data)


def test_a_zero_byte_rate_is_rejected() -> None:
    data = bytearray(make_wav(1.0))
    data[28:32] = b"\x00\x00\x00\x00"
    with pytest.raises(ValueError, match="audio must be WAV"):
        wav_duration_seconds(bytes(data))


# multipart ------------------------------------------------------------------------------


def test_it_extracts_a_named_field() -> None:
    body = multipart([("model", b"whisper-large", None), ("file", b"RIFF\r\n--data", "a.wav")])
    content_type = "multipart/form-data; boundary=XyZ"
    assert multipart_field(body, content_type, "model") == b"whisper-large"
    assert multipart_field(body, content_type, "file") == b"RIFF\r\n--data"


def test_filename_is_not_mistaken_for_name() -> None:
    body = multipart([("file", b"audio", "model")])
    assert multipart_field(body, FORM, "model") is None


def test_a_quoted_boundary_and_upper_case_type_work() -> None:
    body = multipart([("model", b"m1", None)], boundary="a;b c")
    assert multipart_field(body, 'Multipart/Form-Data; boundary="a;b c"', "model") == b"m1"


def test_an_empty_field_value_is_empty_bytes() -> None:
    body = multipart([("model", b"", None)])
    assert multipart_field(body, FORM, "model") == b""


def test_a_missing_field_is_none() -> None:
    body = multipart([("file", b"audio", "a.wav")])
    assert multipart_field(body, FORM, "model") is None


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (PART_HEAD + b"\r\n\r\nm1", FORM),  # no closing delimiter
        (PART_HEAD, FORM),  # headers never end
        (b"no delimiter here", FORM),
        (WHOLE_PART, "multipart/form-data"),  # no boundary
        (WHOLE_PART, "application/json"),
        (WHOLE_PART, ""),
    ],
)
def test_malformed_bodies_or_content_types_give_none(body: bytes, content_type: str) -> None:
    assert multipart_field(body, content_type, "model") is None


def test_a_large_upload_before_the_field_is_walked_past() -> None:
    big = b"\x00" * 5_000_000
    body = multipart([("file", big, "a.wav"), ("model", b"tiny", None)])
    assert multipart_field(body, FORM, "model") == b"tiny"


def test_added_form_fields_come_before_the_end_and_keep_every_other_part() -> None:
    body = multipart([("model", b"whisper-large", None), ("file", b"RIFF\r\n--data", "a.wav")])
    content_type = "multipart/form-data; boundary=XyZ"

    added = with_multipart_fields(body, content_type, [("translate", "true"), ("lang", "en")])

    assert added is not None
    assert multipart_field(added, content_type, "translate") == b"true"
    assert multipart_field(added, content_type, "lang") == b"en"
    assert multipart_field(added, content_type, "file") == b"RIFF\r\n--data"
    assert multipart_field(added, content_type, "model") == b"whisper-large"
    assert added.endswith(b"--XyZ--\r\n")


@pytest.mark.parametrize(
    ("body", "content_type"),
    [(b'{"model": "m"}', "application/json"), (b"--XyZ\r\n", "multipart/form-data; boundary=XyZ")],
)
def test_fields_are_not_added_to_what_is_not_a_whole_form(body: bytes, content_type: str) -> None:
    assert with_multipart_fields(body, content_type, [("translate", "true")]) is None
