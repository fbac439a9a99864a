"""Accounts and projects: what `letsinfer user` and `letsinfer project` do on
the main, and what the portal's sign-up and key pages ask of the authority.
Every change and every refusal leaves its audit record.

An account starts pending (it can do nothing); `user approve NAME --project P`
makes it active in a project. A project's models bound its keys' models, and
its limits (rpm, tpm, a token budget per period) are shared by all its keys
(counted by the gateway, letsinfer.gateway.limits, as one more scope).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from letsinfer.authority.apikeys import IssuedKey, check_policy, create_key, policy_text
from letsinfer.authority.refusals import audited
from letsinfer.portal.passwords import PasswordRefused, hash_password
from letsinfer.store import AuthorityStore, StoreError
from letsinfer.store.people import ACTIVE, SUSPENDED, AccountRecord, ProjectRecord

NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def valid_name(name: str) -> str | None:
    return name if NAME.fullmatch(name) else None


def _account(store: AuthorityStore, name: str) -> AccountRecord:
    acc = store.get_account(name)
    if acc is None:
        raise StoreError(f"no account named {name!r} (see `letsinfer user list`)")
    return acc


def _project(store: AuthorityStore, name: str) -> ProjectRecord:
    proj = store.get_project(name)
    if proj is None:
        raise StoreError(f"no project named {name!r} (see `letsinfer project list`)")
    return proj


# -- accounts ---------------------------------------------------------------
def sign_up(store: AuthorityStore, name: str, password: str) -> None:
    """A pending account, audited. StoreError when the name is invalid or
    taken, or the password too short or long: anyone may try, so a refusal
    is not written to the chain (it changed nothing)."""
    if valid_name(name) is None:
        raise StoreError("a name is 1-64 lower-case letters, digits, '.', '_' or '-'")
    try:
        hashed = hash_password(password)
    except PasswordRefused as exc:
        raise StoreError(str(exc)) from None
    with store.transaction():
        if not store.add_account(name, hashed):
            raise StoreError(f"the name {name!r} is taken")
        store.append_audit("portal", "user.signup", "ok", target=name)


def approve(store: AuthorityStore, name: str, project: str, actor: str = "cli") -> None:
    """Active in ``project`` (a suspended account too: approving reinstates)."""
    with audited(store, actor, "user.approve", valid_name(name)), store.transaction():
        _account(store, name)
        _project(store, project)
        store.set_account(name, state=ACTIVE, project=project)
        store.append_audit(actor, "user.approve", "ok", target=name, detail=f"project={project}")


def suspend(store: AuthorityStore, name: str, actor: str = "cli") -> None:
    """Its sessions end, and its keys are refused from the gateway's next
    directory refresh on (at once when asked through the running node)."""
    with audited(store, actor, "user.suspend", valid_name(name)), store.transaction():
        _account(store, name)
        store.set_account(name, state=SUSPENDED)
        store.end_sessions_of(name)
        store.append_audit(actor, "user.suspend", "ok", target=name)


def remove(store: AuthorityStore, name: str, actor: str = "cli") -> None:
    """The account, its sessions; its keys are revoked."""
    with audited(store, actor, "user.remove", valid_name(name)), store.transaction():
        _account(store, name)
        store.remove_account(name)
        store.append_audit(actor, "user.remove", "ok", target=name)


def reset_password(store: AuthorityStore, name: str, actor: str = "cli") -> str:
    """A new random password (shown once to the administrator); its sessions end."""
    password = secrets.token_urlsafe(18)
    with audited(store, actor, "user.reset_password", valid_name(name)), store.transaction():
        _account(store, name)
        store.set_account(name, password_hash=hash_password(password))
        store.end_sessions_of(name)
        store.append_audit(actor, "user.reset_password", "ok", target=name)
    return password


def grant(store: AuthorityStore, name: str, role: str, actor: str = "cli") -> None:
    with audited(store, actor, "user.grant", valid_name(name)), store.transaction():
        if role != "operator":
            raise StoreError(f"the only role to grant is operator (got {role!r})")
        _account(store, name)
        store.set_account(name, operator=1)
        store.append_audit(actor, "user.grant", "ok", target=name, detail="operator")


def account_json(acc: AccountRecord) -> dict[str, Any]:
    return {
        "name": acc.name,
        "state": acc.state,
        "project": acc.project,
        "operator": acc.operator,
        "created_at": acc.created_at,
    }


# -- projects ---------------------------------------------------------------
def _models(store: AuthorityStore, models: tuple[str, ...]) -> tuple[str, ...]:
    canonical: list[str] = []
    for model in models:
        svc = store.resolve_service(model)
        if svc is None and store.get_adapter(model) is None:
            raise StoreError(f"model {model!r} does not exist (see `letsinfer model list`)")
        name = svc.name if svc is not None else model
        if name not in canonical:
            canonical.append(name)
    return tuple(canonical)


def _project_policy(policy: dict[str, Any], current: ProjectRecord | None) -> dict[str, Any]:
    """Checked as a key's limits are (the same rules, the same messages)."""
    band = policy.get("band")
    merged = {k: v for k, v in policy.items() if k != "band"}
    if current is not None:  # a budget keeps its period when only its size changes
        if merged.get("budget_tokens") is not None and "budget_period" not in merged:
            merged["budget_period"] = current.budget_period
        if "budget_period" in merged and "budget_tokens" not in merged:
            merged["budget_tokens"] = current.budget_tokens
    out = check_policy(merged)
    if "band" in policy:
        if band is not None:
            check_policy({"band": band})
        out["band"] = band
    return out


def create_project(
    store: AuthorityStore,
    name: str,
    models: tuple[str, ...] = (),
    policy: dict[str, Any] | None = None,
    actor: str = "cli",
) -> ProjectRecord:
    with audited(store, actor, "project.create", valid_name(name)):
        if valid_name(name) is None:
            raise StoreError("a project name is 1-64 lower-case letters, digits, '.', '_' or '-'")
        change = _project_policy({k: v for k, v in (policy or {}).items() if v is not None}, None)
        with store.transaction():
            store.add_project(name, _models(store, models), change)
            store.append_audit(
                actor, "project.create", "ok", target=name, detail=policy_text(change) or None
            )
    return _project(store, name)


def set_project_limits(
    store: AuthorityStore,
    name: str,
    policy: dict[str, Any],
    models: tuple[str, ...] | None = None,
    actor: str = "cli",
) -> ProjectRecord:
    with audited(store, actor, "project.limits", valid_name(name)), store.transaction():
        change = _project_policy(policy, _project(store, name))
        listed = _models(store, models) if models is not None else None
        store.set_project(name, change, listed)
        detail = policy_text(change)
        if listed is not None:
            detail = f"{detail} models={','.join(listed) or 'all'}".strip()
        store.append_audit(actor, "project.limits", "ok", target=name, detail=detail or None)
    return _project(store, name)


def remove_project(store: AuthorityStore, name: str, actor: str = "cli") -> None:
    with audited(store, actor, "project.remove", valid_name(name)), store.transaction():
        _project(store, name)
        store.remove_project(name)
        store.append_audit(actor, "project.remove", "ok", target=name)


def project_json(store: AuthorityStore, proj: ProjectRecord) -> dict[str, Any]:
    return {
        "name": proj.name,
        "models": list(proj.models),
        "band": proj.band,
        "rpm": proj.rpm,
        "tpm": proj.tpm,
        "budget_tokens": proj.budget_tokens,
        "budget_period": proj.budget_period,
        "members": store.project_members(proj.name),
        "keys": [k.name for k in store.list_api_keys() if k.project == proj.name],
    }


# -- an account's own keys --------------------------------------------------
def create_own_key(
    store: AuthorityStore, owner: str, label: str, models: tuple[str, ...]
) -> IssuedKey:
    """A key of an active account, in its project, with a subset of the
    project's models (none given: all the project's). Its name is the owner's
    and the label the account chose: ``OWNER--LABEL``."""
    acc = _account(store, owner)
    if acc.state != ACTIVE or acc.project is None:
        raise StoreError("this account is not approved")
    proj = _project(store, acc.project)
    if proj.models:
        outside = [m for m in models if m not in proj.models]
        if outside:
            raise StoreError(f"not a model of project {proj.name}: {', '.join(outside)}")
        models = models or proj.models
    return create_key(
        store,
        f"{owner.replace('.', '_')}--{label}",
        models,
        actor=f"user:{owner}",
        owner=owner,
        project=proj.name,
    )


def revoke_own_key(store: AuthorityStore, owner: str, key_id: str) -> str:
    """Only a key ``owner`` owns (the UPDATE's WHERE says so)."""
    with store.transaction():
        name = store.revoke_own_key(owner, key_id)
        if name is None:
            raise StoreError("no such key of yours")
        store.append_audit(f"user:{owner}", "auth.key.revoke", "ok", target=name)
    return name
