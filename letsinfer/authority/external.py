"""External models and fallbacks, as the authority records them.

An external model is an OpenAI-compatible provider published under a model
name: the authority keeps its URL, the provider's model name, the path of the
file that holds the provider's key (never the key: the gateway reads the file
when it sends a request), an optional CA file for the provider's TLS, and how
many requests it may have there at once. A fallback names the model that
answers a request when none of a model's own groups can.
"""

from __future__ import annotations

import ssl
import stat
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from letsinfer.authority.models import audit_target, check_model_name, resolve_fallback
from letsinfer.authority.refusals import audited
from letsinfer.fetch import FetchPolicy, FetchRefused
from letsinfer.fetch import check_url as check_fetchable
from letsinfer.fetch.destinations import address_refusal
from letsinfer.gateway.external import sendable
from letsinfer.store import AuthorityStore, ServiceRecord, StoreError
from letsinfer.store.adapters import AdapterRecord

DEFAULT_CONCURRENCY = 64  # requests at the provider at once, unless told


def check_url(url: str) -> str:
    """The provider's API base, its scheme and host in lower case (as the
    gateway and the CLI compare them) and no trailing slash."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise StoreError(f"{_shown(url)!r}: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StoreError(
            f"{_shown(url)!r} is not an http(s) URL (such as https://api.example.com/v1)"
        )
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise StoreError(
            f"{_shown(url)!r} has characters a request line cannot carry: write the host "
            "in its ASCII form (xn--...) and percent-encode the path"
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise StoreError(
            f"{_shown(url)!r}: give the provider's API base only (no user, query or fragment); "
            "its key goes in --key-file"
        )
    return urlunsplit((parts.scheme, parts.netloc.lower(), parts.path, "", "")).rstrip("/")


def _shown(url: str) -> str:
    """A refused URL as a message (and the audit chain) may show it: without
    a user, password, query or fragment, which may hold a secret."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url.split("@")[-1].split("?")[0].split("#")[0]
    host = parts.netloc.rpartition("@")[2]
    hidden = "…" if parts.query or parts.fragment else ""
    return urlunsplit((parts.scheme, host, parts.path, "", "")) + hidden


def check_key_file(path: Path) -> str:
    """An absolute path to a readable, private, one-line key file. Only its
    shape is checked here: the key itself is never shown, stored or logged."""
    path = path.expanduser().absolute()
    try:
        st = path.stat()
    except OSError as exc:
        raise StoreError(f"key file {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"key file {path} is not a regular file")
    private = f"make it private first (chmod 600 {path}, or 640 with the letsinfer group)"
    if st.st_mode & stat.S_IROTH:
        raise StoreError(f"key file {path} can be read by every user of this machine; {private}")
    if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP):
        who = "every user of this machine" if st.st_mode & stat.S_IWOTH else "its group"
        raise StoreError(
            f"key file {path} can be written by {who}, who could swap in their own key; {private}"
        )
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"key file {path} cannot be read: {exc}") from exc
    key = text.strip()
    if not key or "\n" in key or "\r" in key:
        raise StoreError(f"key file {path} must hold exactly one line: the provider's API key")
    if not sendable(key):
        raise StoreError(
            f"key file {path}: the key must be visible ASCII characters with no spaces "
            "(it is sent in an HTTP header)"
        )
    return str(path)


def check_ca_file(path: Path) -> str:
    path = path.expanduser().absolute()
    try:
        ssl.create_default_context(cafile=str(path))
    except (OSError, ssl.SSLError) as exc:
        raise StoreError(f"CA file {path}: not a PEM certificate bundle ({exc})") from exc
    return str(path)


def add_external_model(
    store: AuthorityStore,
    name: str,
    url: str,
    provider_model: str,
    key_file: Path | None,
    *,
    ca_file: Path | None = None,
    concurrency: int | None = None,
    aliases: tuple[str, ...] = (),
    fallback: str | None = None,
    actor: str = "cli",
    policy: FetchPolicy | None = None,
) -> ServiceRecord:
    """Record an external model (audited); every check happens before anything
    changes, and a refusal is audited and changes nothing else. The URL's
    addresses must be ones ``policy`` (the node's ``[fetch]``; every command
    passes it, ``None`` skips the check) allows: checked when the operator
    gives the URL, and as the main starts (``refused_providers``), never per
    request on the gateway."""
    with audited(store, actor, "model.add", audit_target(name)):
        check_model_name(name)
        for alias in aliases:
            check_model_name(alias)
        store.check_new_names(name, aliases)
        if not provider_model or len(provider_model) > 256 or not provider_model.isprintable():
            raise StoreError(
                "--provider-model must be the provider's model name (1-256 characters)"
            )
        if concurrency is not None and not 1 <= concurrency <= 4096:
            raise StoreError("--concurrency must be between 1 and 4096")
        external: dict[str, Any] = {
            "url": check_url(url),
            "provider_model": provider_model,
            "key_file": check_key_file(key_file) if key_file is not None else None,
            "ca_file": check_ca_file(ca_file) if ca_file is not None else None,
            "concurrency": concurrency or DEFAULT_CONCURRENCY,
        }
        if external["ca_file"] and urlsplit(external["url"]).scheme != "https":
            raise StoreError("--ca-file is for an https URL")
        if policy is not None:
            try:
                check_fetchable(external["url"], policy)
            except FetchRefused as exc:
                raise StoreError(f"--external: {exc}") from exc
        target = resolve_fallback(store, name, fallback, aliases) if fallback is not None else None
    with store.transaction():
        svc = store.add_service(
            name, "", 0, "external", external["url"], aliases, external=external, fallback=target
        )
        store.append_audit(
            actor,
            "model.add",
            "ok",
            target=name,
            detail=f"external: {external['url']} as {provider_model}",
        )
    return svc


def refused_providers(store: AuthorityStore, policy: FetchPolicy) -> dict[str, tuple[str, str]]:
    """The external models whose provider ``policy`` refuses now: name to its
    URL and why. The main asks once as it starts (its ``[fetch]`` may have
    changed since a model was added): the gateway does no DNS work per request."""
    refused: dict[str, tuple[str, str]] = {}
    for service in store.list_services():
        if service.external:
            url = service.external["url"]
            why = address_refusal(url, policy)
            if why is not None:
                refused[service.name] = (url, why)
    return refused


def set_fallback(
    store: AuthorityStore,
    name: str,
    fallback: str | None,
    *,
    actor: str = "cli",
    role: str | None = None,
) -> ServiceRecord | AdapterRecord:
    """Set (or, with None, clear) the model that answers when this one (a model,
    alias or LoRA adapter) cannot."""
    with audited(store, actor, "model.fallback", audit_target(name), role=role):
        svc = store.resolve_service(name)
        adapter = store.get_adapter(name) if svc is None else None
        if svc is None and adapter is None:
            raise StoreError(f"no model {name!r} (see `letsinfer model list`)")
        canonical = svc.name if svc is not None else name
        target = resolve_fallback(store, canonical, fallback) if fallback is not None else None
    with store.transaction():
        if svc is not None:
            store.set_fallback(canonical, target)
        else:
            store.set_adapter_fallback(canonical, target)
        store.append_audit(
            actor,
            "model.fallback",
            "ok",
            role=role,
            target=canonical,
            detail=f"fallback {target}" if target else "no fallback",
        )
    updated = store.get_service(canonical) if svc is not None else store.get_adapter(canonical)
    assert updated is not None
    return updated


def fallback_notes(store: AuthorityStore, name: str) -> list[str]:
    """What an operator may not expect of NAME's fallback (a model, alias or
    adapter): accepted, but worth a line when it is set."""
    svc = store.resolve_service(name)
    adapter = store.get_adapter(name) if svc is None else None
    record = svc or adapter
    if record is None or not record.fallback:
        return []
    canonical, target = (svc.name if svc is not None else name), record.fallback
    notes = []
    other = store.get_service(target) or store.get_adapter(target)
    if other is not None and other.fallback == canonical:
        notes.append(
            f"{target} falls back to {canonical} in turn: a request goes at most one hop, "
            "so it never loops"
        )
    if adapter is not None and target == adapter.service:
        notes.append(
            f"{target} is the base model of adapter {canonical}: its fallback answers "
            "without the adapter"
        )
    return notes
