"""Hugging Face origins of model assets: `hf://owner/repo@<commit>/<path>` (reference §7.2, §7.4).

An origin counts only when the hub says the revision is exactly the pinned commit and the file
at that path is stored with an LFS hash equal to the reference's SHA-256; the downloaded bytes
are hashed again before they are kept. The hub is reached through `huggingface_hub`, so
`HF_ENDPOINT` (and the library's other settings) choose which hub that is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from routerproject.errors import RouterError

SOURCE_HF = "hf_lfs_sha256"
_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_RE = re.compile(rf"{_REPO_PART}/{_REPO_PART}")
_COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_URI_RE = re.compile(r"hf://(?P<repo>[^@]+)@(?P<commit>[^/]+)/(?P<path>.+)")
HUB_TIMEOUT_SECS = 30.0


class OriginMismatch(Exception):
    """The hub does not vouch for this hash at this commit and path."""


@dataclass(frozen=True)
class HfOrigin:
    repository: str
    commit: str
    path: str

    @property
    def uri(self) -> str:
        return f"hf://{self.repository}@{self.commit}/{self.path}"


def check_origin(
    repository: object,
    commit: object,
    path: object,
    *,
    param: str,
    commit_param: str | None = None,
    path_param: str | None = None,
) -> HfOrigin:
    """A safe repository, a full hex commit and a relative path; RouterError 400 otherwise.

    `param` names the field at fault, or the repository's field when the other two have
    fields of their own (`commit_param`, `path_param`).
    """
    commit_param = commit_param or param
    path_param = path_param or param
    if not isinstance(repository, str) or not _REPO_RE.fullmatch(repository) or ".." in repository:
        raise RouterError(400, f"{param}: the repository must be owner/name", param=param)
    if not isinstance(commit, str) or not _COMMIT_RE.fullmatch(commit):
        raise RouterError(
            400,
            f"{commit_param}: the commit must be 40 lower-case hex characters",
            param=commit_param,
        )
    if (
        not isinstance(path, str)
        or not path
        or path.startswith("/")
        or "\\" in path
        or any(part in ("", ".", "..") for part in path.split("/"))
        or any(ord(ch) < 32 for ch in path)
    ):
        raise RouterError(
            400, f"{path_param}: the path must be relative, without . or ..", param=path_param
        )
    return HfOrigin(repository, commit, path)


def parse_origin(text: object, *, param: str) -> HfOrigin:
    match = _URI_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise RouterError(
            400, f"{param} must look like hf://owner/repo@<commit>/<path>", param=param
        )
    return check_origin(match["repo"], match["commit"], match["path"], param=param)


def verify(origin: HfOrigin, sha256: str, *, token: str | None = None) -> int:
    """The file's size, once the hub vouches for `sha256` there; OriginMismatch if it does not.

    Blocking (huggingface_hub's client is synchronous): run it in a worker thread.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        info = HfApi().model_info(
            origin.repository,
            revision=origin.commit,
            files_metadata=True,
            token=token or False,
            timeout=HUB_TIMEOUT_SECS,
        )
    except HfHubHTTPError as exc:
        raise OriginMismatch(f"the hub refused {origin.uri}: {exc}") from exc
    except OSError as exc:
        raise OriginMismatch(f"the hub at did not answer for {origin.uri}: {exc}") from exc
    if info.sha != origin.commit:
        raise OriginMismatch(
            f"revision {origin.commit} of {origin.repository} resolves to {info.sha}"
        )
    sibling = next((s for s in info.siblings or [] if s.rfilename == origin.path), None)
    if sibling is None:
        raise OriginMismatch(f"{origin.repository}@{origin.commit} has no file {origin.path}")
    lfs: Any = sibling.lfs
    if lfs is None or getattr(lfs, "sha256", None) != sha256:
        found = getattr(lfs, "sha256", None) if lfs is not None else "no LFS hash"
        raise OriginMismatch(f"{origin.uri} is stored with LFS hash {found}, not {sha256}")
    size = getattr(lfs, "size", None)
    if not isinstance(size, int):
        raise OriginMismatch(f"{origin.uri} has no size")
    return size


def download_url(origin: HfOrigin) -> str:
    from huggingface_hub import hf_hub_url

    return str(hf_hub_url(origin.repository, origin.path, revision=origin.commit))


# -- bound origins (the router database) ----------------------------------------------------


def bind(sha256: str, origin: HfOrigin) -> None:
    from django.utils import timezone

    from registry.models import HfAssetOrigin

    HfAssetOrigin.objects.update_or_create(
        sha256=sha256,
        defaults={
            "repository": origin.repository,
            "repository_path": origin.path,
            "commit": origin.commit,
            "bound_at": timezone.now(),
        },
    )


def bound(sha256: str) -> HfOrigin | None:
    from registry.models import HfAssetOrigin

    row = HfAssetOrigin.objects.filter(sha256=sha256).first()
    if row is None:
        return None
    return HfOrigin(row.repository, row.commit, row.repository_path)
