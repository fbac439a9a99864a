"""A Hugging Face-compatible hub: one small seam.

``resolve`` turns a revision into a commit and lists the repository's files with
the sha256 and size the hub publishes for each (its LFS object ids), through
``huggingface_hub``'s API client. ``download`` asks the hub where the file of
that commit lives (``huggingface_hub``'s metadata call, which checks the
commit and the sha256 again) and streams it into a partial file, written as
it arrives, so that a dropped connection resumes with HTTP Range from the
last byte received (huggingface_hub's own loop restarts a file smaller than
its 10 MB read size from zero). The caller verifies the bytes.

The endpoint and the token are always passed explicitly: nothing falls back to
huggingface.co, nor to a token some other tool left on the machine.

The endpoint is an operator's URL, so it is fetched as ``[fetch]`` allows
(``letsinfer.fetch``): huggingface_hub's calls and the file bytes both go
through guarded clients, which check every connection's address and follow
redirects only within the hub (its own host and hosts under it; for
huggingface.co its storage hosts).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from letsinfer import __version__
from letsinfer.bundle.progress import Progress
from letsinfer.fetch import FetchPolicy, FetchRefused, check_url, guarded_client
from letsinfer.fetch.destinations import redirect_refusal
from letsinfer.fetch.hfhub import use_guarded_session
from letsinfer.hub.choice import RepoFile

# Read by huggingface_hub when it is first imported: no usage reports, and no
# token from ~/.cache/huggingface unless one is given.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")

log = logging.getLogger(__name__)
_RETRIES = 5  # attempts in a row that bring no new byte
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


class HubError(Exception):
    """The hub answered, and the answer refuses the request; the message says why."""


class HubUnreachable(HubError):
    """The hub could not be asked (no route, refused, timed out, or it is failing)."""


@dataclass(frozen=True)
class Snapshot:
    """A repository at one commit: what a pull picks from."""

    repo: str
    revision: str  # as asked (a branch, a tag or a commit)
    commit: str
    files: tuple[RepoFile, ...]
    where: str  # "hub <endpoint>" or "mirror <bundle id>"


def check_repo(repo: str) -> None:
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise HubError(f"{repo!r} is not a repository id (such as org/name)")


def read_token(token_file: str | None) -> str | None:
    """The token in ``token_file`` (first line), or None when none is configured."""
    if token_file is None:
        return None
    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        raise HubError(f"[hub] token_file {token_file}: cannot read it ({exc.strerror})") from exc
    if not token or any(c.isspace() for c in token):
        raise HubError(f"[hub] token_file {token_file}: does not hold one token")
    return token


def _storage_hosts(endpoint: str) -> tuple[str, ...]:
    """Hosts a hub's files may be redirected to: under the hub's own host, and
    for huggingface.co its storage (cdn-lfs.hf.co, cas-bridge.xethub.hf.co)."""
    host = (urlsplit(endpoint).hostname or "").lower()
    hosts = [f".{host}"]
    if host in ("huggingface.co", "hf.co"):
        hosts += [".huggingface.co", ".hf.co"]
    return tuple(hosts)


class HubClient:
    def __init__(
        self, endpoint: str, token: str | None, timeout_s: float, policy: FetchPolicy
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s
        self._policy = dataclasses.replace(
            policy,
            allow_redirect_hosts=policy.allow_redirect_hosts + _storage_hosts(self.endpoint),
        )

    def _check_endpoint(self) -> None:
        # A refused endpoint is one this node may not reach: a pull goes on to
        # the node's mirror as it would without a route, and says why. (The
        # guarded clients check again at each connection.)
        try:
            check_url(self.endpoint, self._policy)
        except FetchRefused as exc:
            raise HubUnreachable(f"{exc} ([hub] endpoint)") from exc
        use_guarded_session(self._policy)

    def _credential(self) -> str | bool:
        return self._token if self._token else False  # False: send no token at all

    def resolve(self, repo: str, revision: str) -> Snapshot:
        check_repo(repo)
        self._check_endpoint()
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint, token=self._credential(), library_name="letsinfer")
        info = self._call(
            lambda: api.model_info(
                repo, revision=revision, files_metadata=True, timeout=self.timeout_s
            ),
            f"{repo}@{revision}",
        )
        commit = str(info.sha or "")
        if not _COMMIT.fullmatch(commit):
            raise HubError(
                f"{self.endpoint} gave no commit for {repo}@{revision} (got {commit!r}); "
                "is it a Hugging Face-compatible hub?"
            )
        files = []
        for sibling in info.siblings or []:
            lfs = sibling.lfs
            if lfs is None:
                continue  # small files in git: no published sha256, never a model
            sha256 = str(lfs.sha256)
            if not _SHA256.fullmatch(sha256):
                raise HubError(f"{repo}: the hub lists {sibling.rfilename} with no valid sha256")
            files.append(RepoFile(sibling.rfilename, int(lfs.size), sha256))
        return Snapshot(repo, revision, commit, tuple(files), f"hub {self.endpoint}")

    def download(
        self, snapshot: Snapshot, file: RepoFile, partial: Path, progress: Progress
    ) -> None:
        """Bring ``partial`` up to ``file.size`` bytes, resuming what it holds."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(snapshot.repo, file.name, revision=snapshot.commit, endpoint=self.endpoint)
        where = f"{snapshot.repo}@{snapshot.commit[:12]}:{file.name}"
        self._check_endpoint()
        meta = self._call(
            lambda: get_hf_file_metadata(
                url, token=self._credential(), timeout=self.timeout_s, endpoint=self.endpoint
            ),
            where,
        )
        if meta.commit_hash and meta.commit_hash != snapshot.commit:
            raise HubError(f"{where}: the hub serves commit {meta.commit_hash}, not the one listed")
        if meta.etag and _SHA256.fullmatch(meta.etag) and meta.etag != file.sha256:
            raise HubError(
                f"{where}: the hub names the file sha256:{meta.etag}, but listed "
                f"sha256:{file.sha256}; refusing an inconsistent hub"
            )
        headers = build_hf_headers(
            token=self._credential(), library_name="letsinfer", library_version=__version__
        )
        headers["Accept-Encoding"] = "identity"  # the bytes as published, countable
        location = meta.location or url
        # The hub's answer is a redirect: followed only within the hub.
        import httpx

        refusal = redirect_refusal(httpx.URL(url), httpx.URL(location), self._policy)
        if refusal:
            raise HubError(f"{where}: {refusal}")
        if urlsplit(location).netloc != urlsplit(url).netloc:
            headers.pop("authorization", None)  # a signed storage URL: the token stays with the hub
        if partial.exists() and partial.stat().st_size > file.size:
            partial.unlink()  # longer than the file can be: it is not a prefix of it
        progress.start(file.name, file.size)
        try:
            progress.advance(partial.stat().st_size if partial.exists() else 0)
            self._transfer(location, headers, partial, file.size, progress, where)
        finally:
            progress.finish()

    def _transfer(
        self,
        url: str,
        headers: dict[str, str],
        partial: Path,
        size: int,
        progress: Progress,
        where: str,
    ) -> None:
        """GET with ``Range: bytes=N-`` from what ``partial`` holds, written as it
        arrives; a dropped connection is resumed where it stopped, up to
        ``_RETRIES`` times in a row without progress."""
        import httpx

        stalled = 0
        with guarded_client(self._policy, timeout=self.timeout_s, follow_redirects=True) as http:
            while True:
                have = partial.stat().st_size if partial.exists() else 0
                if have >= size:
                    return
                ask = {**headers, "Range": f"bytes={have}-"} if have else headers
                before = have
                try:
                    with http.stream("GET", url, headers=ask) as response:
                        if response.status_code == 416:
                            return  # nothing more to send: the size check decides
                        if response.status_code not in (200, 206):
                            raise HubError(f"{where}: HTTP {response.status_code}")
                        mode = "ab" if response.status_code == 206 else "wb"
                        if mode == "wb" and have:
                            progress.advance(-have)  # the server starts over
                        with partial.open(mode) as fh:
                            for chunk in response.iter_bytes():
                                fh.write(chunk)
                                progress.advance(len(chunk))
                            fh.flush()
                            os.fsync(fh.fileno())
                    return
                except FetchRefused as exc:
                    raise HubError(f"{where}: {exc}") from exc
                except httpx.TransportError as exc:
                    have = partial.stat().st_size if partial.exists() else 0
                    stalled = 0 if have > before else stalled + 1
                    if isinstance(exc, httpx.ConnectError) or stalled > _RETRIES:
                        raise HubUnreachable(
                            f"{where}: the download stopped at {have} of {size} bytes "
                            f"({_reason(exc)}); run the same pull again to resume"
                        ) from exc
                    log.warning(
                        "%s: connection lost at %d of %d bytes (%s); resuming",
                        where,
                        have,
                        size,
                        _reason(exc),
                    )
                    time.sleep(min(0.2 * (stalled + 1), 2.0))

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        """Run one huggingface_hub call; its many failures become two kinds."""
        import httpx2
        from huggingface_hub import errors

        try:
            return fn()
        except FetchRefused as exc:  # a redirect elsewhere, or an address not allowed
            raise HubError(f"{what}: {exc}") from exc
        except errors.OfflineModeIsEnabled as exc:
            raise HubUnreachable(f"{self.endpoint}: HF_HUB_OFFLINE is set") from exc
        except (httpx2.TransportError, ConnectionError, TimeoutError) as exc:
            raise HubUnreachable(f"cannot reach {self.endpoint} ({_reason(exc)})") from exc
        except errors.GatedRepoError as exc:
            raise HubError(
                f"{what} is gated: accept its terms on the hub and set [hub] token_file"
            ) from exc
        except errors.RepositoryNotFoundError as exc:
            raise HubError(
                f"{what}: no such repository on {self.endpoint} (or it is private: "
                "set [hub] token_file)"
            ) from exc
        except errors.RevisionNotFoundError as exc:
            raise HubError(f"{what}: no such revision on {self.endpoint}") from exc
        except errors.EntryNotFoundError as exc:
            raise HubError(f"{what}: no such file on {self.endpoint}") from exc
        except errors.HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if status >= 500 or status in (408, 429):
                raise HubUnreachable(f"{self.endpoint} is failing (HTTP {status})") from exc
            raise HubError(f"{what}: the hub refused (HTTP {status})") from exc
        except OSError as exc:  # huggingface_hub's size check, a full disk
            raise HubError(f"{what}: {exc}") from exc


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
