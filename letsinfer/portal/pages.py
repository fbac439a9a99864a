"""The portal's pages under ``/ui/``, mounted on the gateway's app: sign up,
sign in, sign out, my keys, my usage, models, and for operators the cluster
at a glance. Server-rendered (Jinja2, autoescaped), forms that work without
script; every state-changing form carries a CSRF token checked against the
session (or, before sign-in, against the pre cookie).

The portal's database work and password hashing run on a thread of its own,
with its own authority connection: argon2 never stalls the gateway's loop,
and the inference POSTs never reach this module (the gateway answers them
before any routing)."""

from __future__ import annotations

import asyncio
import html
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from letsinfer.audit.anchor import open_authority
from letsinfer.authority import people
from letsinfer.config import PortalSettings
from letsinfer.gateway.gateway import Gateway
from letsinfer.home import Home
from letsinfer.portal import signin
from letsinfer.portal.sessions import PRE_COOKIE, SESSION_COOKIE, PreTokens, digest, new_id, same
from letsinfer.store import AuthorityStore, StoreError
from letsinfer.store.people import ACTIVE, AccountRecord
from letsinfer.store.requests import RequestStore

T = TypeVar("T")
HERE = Path(__file__).parent
MAX_FORM = 64 * 1024
USAGE_DAYS = 30
OPERATOR_REFRESH_S = 15  # the cluster page reloads itself (no script: the CSP allows none)
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # (no-referrer would make forms send Origin: null)
    (b"cache-control", b"no-store"),  # pages hold secrets and tokens: never kept
]


class Headers:
    """Strict headers on every answer of the portal."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *[(k, v) for k, v in message.get("headers", []) if k != b"cache-control"],
                    *HEADERS,
                ]
            await send(message)

        await self.app(scope, receive, with_headers)  # type: ignore[arg-type]


class Signed:
    """A signed-in visitor: the account, as read at this request."""

    def __init__(self, account: AccountRecord, csrf: str, session_id: str) -> None:
        self.account = account
        self.csrf = csrf
        self.session_id = session_id


class Portal:
    def __init__(
        self, home: Home, settings: PortalSettings, gw: Gateway, gateway_url: Callable[[], str]
    ) -> None:
        """``gateway_url``: the gateway's own /v1 (the playground asks it, as any client would)."""
        self.home = home
        self.gateway_url = gateway_url
        self.settings = settings
        self.gw = gw
        self.pre = PreTokens()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="portal")
        self._store: AuthorityStore | None = None
        self._records: RequestStore | None = None
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.css = (HERE / "static" / "portal.css").read_bytes()
        routes = [
            Route("/", self.index),
            Route("/static/portal.css", self.stylesheet),
            Route("/signin", self.signin_form, methods=["GET"]),
            Route("/signin", self.signin, methods=["POST"]),
            Route("/signup", self.signup_form, methods=["GET"]),
            Route("/signup", self.signup, methods=["POST"]),
            Route("/signout", self.signout, methods=["POST"]),
            Route("/keys", self.keys, methods=["GET"]),
            Route("/keys", self.key_create, methods=["POST"]),
            Route("/keys/{key_id}/revoke", self.key_revoke, methods=["POST"]),
            Route("/usage", self.usage),
            Route("/models", self.models),
            Route("/operator", self.operator),
            Route("/playground", self.playground_form, methods=["GET"]),
            Route("/playground", self.playground, methods=["POST"]),
        ]
        self.app = Headers(Starlette(routes=routes))

    # -- plumbing ---------------------------------------------------------------
    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(store, *args)`` on the portal's thread, with its connection."""

        def run() -> T:
            if self._store is None:
                self._store = open_authority(self.home)
            return fn(self._store, *args)

        return await asyncio.get_running_loop().run_in_executor(self._thread, run)

    def close(self) -> None:
        def shut() -> None:
            if self._store is not None:
                self._store.close()
            if self._records is not None:
                self._records.close()

        self._thread.submit(shut).result()
        self._thread.shutdown()

    def page(self, template: str, status: int = 200, **values: Any) -> HTMLResponse:
        values.setdefault("signed", None)
        body = self.templates.get_template(template).render(**values)
        return HTMLResponse(body, status_code=status)

    def refused(self, status: int, message: str, signed: Signed | None = None) -> HTMLResponse:
        return self.page("message.html", status, title="Refused", message=message, signed=signed)

    @staticmethod
    async def form(request: Request) -> dict[str, list[str]] | None:
        """The urlencoded form (None: too large or not a form)."""
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if kind != "application/x-www-form-urlencoded":
            return None
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_FORM:
                return None
        return urllib.parse.parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)

    @staticmethod
    def one(form: dict[str, list[str]], field: str) -> str:
        values = form.get(field)
        return values[0] if values else ""

    @staticmethod
    def cross_origin(request: Request) -> bool:
        origin = request.headers.get("origin")
        if origin is None or origin == "null":
            return origin == "null"
        return urllib.parse.urlsplit(origin).netloc != request.headers.get("host", "")

    def secure(self, request: Request) -> bool:
        return request.url.scheme == "https"

    def set_cookie(self, response: Response, request: Request, name: str, value: str) -> None:
        response.set_cookie(
            name,
            value,
            max_age=int(self.settings.session_ttl_s),
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=self.secure(request),
        )

    async def signed(self, request: Request) -> Signed | None:
        """The session's account, if it is still signed in and active (read
        now: a suspension or a sign-out counts from the next request)."""
        sid = request.cookies.get(SESSION_COOKIE)
        if not sid or len(sid) > 128:
            return None

        def read(store: AuthorityStore) -> Signed | None:
            session = store.get_session(digest(sid))
            if session is None:
                return None
            account = store.get_account(session.account)
            if account is None or account.state != ACTIVE:
                return None
            return Signed(account, session.csrf, sid)

        return await self.db(read)

    def pre_cookie(self, request: Request) -> tuple[str, bool]:
        pre = request.cookies.get(PRE_COOKIE)
        if pre and 20 <= len(pre) <= 128:
            return pre, False
        return new_id(), True

    async def anonymous_form(self, request: Request, template: str, **values: Any) -> Response:
        if await self.signed(request) is not None:
            return RedirectResponse("/ui/keys", 303)
        pre, fresh = self.pre_cookie(request)
        response = self.page(template, csrf=self.pre.token(pre), **values)
        if fresh:
            self.set_cookie(response, request, PRE_COOKIE, pre)
        return response

    async def anonymous_post(self, request: Request) -> dict[str, list[str]] | Response:
        """A sign-in or sign-up form, or the refusal for a forged one."""
        form = await self.form(request)
        if form is None:
            return self.refused(400, "Not a form this page sends.")
        if self.cross_origin(request) or not self.pre.valid(
            request.cookies.get(PRE_COOKIE), self.one(form, "csrf")
        ):
            return self.refused(403, "This form has expired or came from another site: reload it.")
        return form

    async def signed_post(self, request: Request) -> tuple[Signed, dict[str, list[str]]] | Response:
        signed = await self.signed(request)
        if signed is None:
            return RedirectResponse("/ui/signin", 303)
        form = await self.form(request)
        if form is None:
            return self.refused(400, "Not a form this page sends.", signed)
        if self.cross_origin(request) or not same(signed.csrf, self.one(form, "csrf")):
            return self.refused(
                403, "This form has expired or came from another site: reload it.", signed
            )
        return signed, form

    # -- pages ------------------------------------------------------------------
    async def stylesheet(self, request: Request) -> Response:
        return Response(self.css, media_type="text/css")

    async def index(self, request: Request) -> Response:
        signed = await self.signed(request)
        return RedirectResponse("/ui/keys" if signed else "/ui/signin", 303)

    async def signin_form(self, request: Request) -> Response:
        return await self.anonymous_form(request, "signin.html", error=None)

    async def signin(self, request: Request) -> Response:
        form = await self.anonymous_post(request)
        if isinstance(form, Response):
            return form
        name, password = self.one(form, "name").strip(), self.one(form, "password")
        csrf = self.one(form, "csrf")
        attempt = await self.db(signin.sign_in, self.settings, name, password)
        if attempt.outcome == signin.THROTTLED:
            response = self.page(
                "signin.html",
                429,
                csrf=csrf,
                error="Too many failed sign-ins for this account: try again later.",
            )
            response.headers["retry-after"] = str(attempt.retry_after)
            return response
        if attempt.outcome == signin.WRONG:  # the same bytes for a wrong password and no account
            return self.page("signin.html", 401, csrf=csrf, error="Wrong name or password.")
        if attempt.outcome == signin.NOT_ACTIVE:
            return self.page(
                "signin.html",
                403,
                csrf=csrf,
                error="This account is not active: it waits for an administrator's "
                "approval, or was suspended.",
            )
        assert attempt.account is not None
        sid, token = new_id(), new_id()
        account = attempt.account.name
        ttl = self.settings.session_ttl_s

        def start(store: AuthorityStore) -> None:
            with store.transaction():
                store.add_session(digest(sid), account, token, ttl)

        await self.db(start)
        response = RedirectResponse("/ui/keys", 303)
        self.set_cookie(response, request, SESSION_COOKIE, sid)  # (a planted id is replaced)
        response.delete_cookie(PRE_COOKIE, path="/ui")
        return response

    async def signup_form(self, request: Request) -> Response:
        return await self.anonymous_form(request, "signup.html", error=None)

    async def signup(self, request: Request) -> Response:
        form = await self.anonymous_post(request)
        if isinstance(form, Response):
            return form
        name, password = self.one(form, "name").strip(), self.one(form, "password")
        try:
            await self.db(people.sign_up, name, password)
        except StoreError as exc:
            return self.page(
                "signup.html", 400, csrf=self.one(form, "csrf"), error=str(exc), name=name
            )
        return self.page(
            "message.html",
            201,
            title="Account created",
            message=f"Your account {name} waits for an administrator's approval "
            "(`letsinfer user approve` on the main). Sign in once approved.",
        )

    async def signout(self, request: Request) -> Response:
        posted = await self.signed_post(request)
        if isinstance(posted, Response):
            return posted
        signed, _ = posted

        def end(store: AuthorityStore) -> None:
            store.end_session(digest(signed.session_id))

        await self.db(end)
        response = RedirectResponse("/ui/signin", 303)
        response.delete_cookie(SESSION_COOKIE, path="/ui")
        return response

    async def keys(self, request: Request) -> Response:
        signed = await self.signed(request)
        if signed is None:
            return RedirectResponse("/ui/signin", 303)
        return await self.keys_page(signed)

    async def keys_page(
        self, signed: Signed, issued: str | None = None, error: str | None = None, status: int = 200
    ) -> Response:
        account = signed.account

        def read(store: AuthorityStore) -> tuple[list[Any], tuple[str, ...]]:
            project = store.get_project(account.project or "")
            models = project.models if project is not None and project.models else ()
            return store.keys_of(account.name), models

        keys, models = await self.db(read)
        if not models:  # every model: those the gateway knows now
            models = tuple(s.name for s in self.gw.directory.current().services)
        return self.page(
            "keys.html",
            status,
            signed=signed,
            keys=keys,
            models=models,
            issued=issued,
            error=error,
            when=_when,
        )

    async def key_create(self, request: Request) -> Response:
        posted = await self.signed_post(request)
        if isinstance(posted, Response):
            return posted
        signed, form = posted
        label = self.one(form, "label").strip()
        models = tuple(form.get("model", []))
        try:
            issued = await self.db(people.create_own_key, signed.account.name, label, models)
        except StoreError as exc:
            return await self.keys_page(signed, error=str(exc), status=400)
        self.gw.directory.refresh(force=True)  # usable from its first request
        return await self.keys_page(signed, issued=issued.secret, status=201)

    async def key_revoke(self, request: Request) -> Response:
        posted = await self.signed_post(request)
        if isinstance(posted, Response):
            return posted
        signed, _ = posted
        key_id = request.path_params["key_id"][:64]
        try:
            await self.db(people.revoke_own_key, signed.account.name, key_id)
        except StoreError as exc:
            return await self.keys_page(signed, error=str(exc), status=404)
        self.gw.directory.refresh(force=True)  # refused from its next request
        return RedirectResponse("/ui/keys", 303)

    async def usage(self, request: Request) -> Response:
        signed = await self.signed(request)
        if signed is None:
            return RedirectResponse("/ui/signin", 303)
        owner = signed.account.name
        since = time.time() - USAGE_DAYS * 86400

        def read(store: AuthorityStore) -> list[tuple[str, str, int, int, int]]:
            names = sorted({k.name for k in store.keys_of(owner, include_revoked=True)})
            path = self.home.requests_database
            if not path.exists():
                return []
            if self._records is None:
                self._records = RequestStore(path, readonly=True)
            return self._records.daily_usage(names, since)

        rows = await self.db(read)
        return self.page("usage.html", signed=signed, rows=rows, chart=_chart(rows))

    async def models(self, request: Request) -> Response:
        signed = await self.signed(request)
        if signed is None:
            return RedirectResponse("/ui/signin", 303)
        project = await self.db(lambda store: store.get_project(signed.account.project or ""))
        allowed = set(project.models) if project is not None and project.models else None
        gw = self.gw
        listed = [
            (s.name, gw.availability.state(s.serves))
            for s in gw.directory.current().services
            if allowed is None or s.name in allowed
        ]
        return self.page("models.html", signed=signed, models=listed)

    async def operator(self, request: Request) -> Response:
        signed = await self.signed(request)
        if signed is None:
            return RedirectResponse("/ui/signin", 303)
        if not signed.account.operator:
            return self.refused(403, "This page is for operators.", signed)

        def read(store: AuthorityStore) -> dict[str, Any]:
            nodes = {n.id: n for n in store.list_nodes()}
            gpus = [(n.name, g) for n in nodes.values() for g in (n.facts or {}).get("gpus", [])]
            return {
                "gpus": gpus,
                "nodes": list(nodes.values()),
                "groups": [(g, nodes.get(g.node_id)) for g in store.list_placement_groups()],
                "audit": list(reversed(store.list_audit(limit=30))),
            }

        seen = await self.db(read)
        return self.page(
            "operator.html",
            signed=signed,
            when=_when,
            gib=_gib,
            refresh_s=OPERATOR_REFRESH_S,
            **seen,
        )

    # -- the playground: the real gateway, the user's own key -------------------
    async def playground_models(self, signed: Signed) -> list[str]:
        project = await self.db(lambda store: store.get_project(signed.account.project or ""))
        allowed = set(project.models) if project is not None and project.models else None
        services = self.gw.directory.current().services
        return [s.name for s in services if allowed is None or s.name in allowed]

    async def playground_form(self, request: Request) -> Response:
        signed = await self.signed(request)
        if signed is None:
            return RedirectResponse("/ui/signin", 303)
        models = await self.playground_models(signed)
        return self.page(
            "playground.html", signed=signed, models=models, chosen=None, prompt="", answering=False
        )

    async def playground(self, request: Request) -> Response:
        """The answer streams into the page as the engine writes it (a chunked
        page: no script needed). The key is the user's own, pasted in the
        form: the portal keeps no key's secret."""
        posted = await self.signed_post(request)
        if isinstance(posted, Response):
            return posted
        signed, form = posted
        key, model = self.one(form, "key").strip(), self.one(form, "model")
        prompt = self.one(form, "prompt")
        models = await self.playground_models(signed)
        page = self.templates.get_template("playground.html").render(
            signed=signed, models=models, chosen=model, prompt=prompt, answering=True
        )
        head, _, tail = page.partition("<!--answer-->")
        url = self.gateway_url().rstrip("/") + "/chat/completions"
        body = {"model": model, "stream": True, "messages": [{"role": "user", "content": prompt}]}

        async def stream() -> AsyncIterator[str]:
            yield head
            try:
                async with (
                    httpx.AsyncClient(timeout=httpx.Timeout(300, connect=10)) as client,
                    client.stream(
                        "POST", url, json=body, headers={"authorization": f"Bearer {key}"}
                    ) as answer,
                ):
                    if answer.status_code != 200:
                        raw = await answer.aread()
                        yield '<span class="error">' + html.escape(_error_of(raw)) + "</span>"
                    else:
                        async for line in answer.aiter_lines():
                            text = _delta(line)
                            if text:
                                yield html.escape(text)
            except httpx.HTTPError as exc:
                yield '<span class="error">' + html.escape(f"the gateway: {exc}") + "</span>"
            yield tail

        return StreamingResponse(stream(), media_type="text/html; charset=utf-8")


def _delta(line: str) -> str:
    """The text of one SSE line of a streamed chat answer."""
    if not line.startswith("data:") or line.strip() == "data: [DONE]":
        return ""
    try:
        event = json.loads(line[5:])
        return str(event["choices"][0]["delta"].get("content") or "")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return ""


def _error_of(raw: bytes) -> str:
    try:
        return str(json.loads(raw)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace")[:500]


def _gib(n: Any) -> str:
    return f"{n / 2**30:.1f}" if isinstance(n, int | float) else "-"


def _when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M") if ts else "-"


def _chart(rows: list[tuple[str, str, int, int, int]]) -> list[tuple[str, int, int]]:
    """Tokens per day, as bars: (day, tokens, width in percent of the most)."""
    per_day: dict[str, int] = {}
    for day, _model, _n, prompt, completion in rows:
        per_day[day] = per_day.get(day, 0) + prompt + completion
    most = max(per_day.values(), default=0) or 1
    return [(day, n, max(1, round(100 * n / most))) for day, n in sorted(per_day.items())]


__all__ = ["Portal"]
