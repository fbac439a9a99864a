"""Models' scaling policies (`letsinfer model scale`): a row only for a model
whose policy is not the default (one group, always loaded).

A part of :class:`letsinfer.store.AuthorityStore` (it inherits this class).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from letsinfer.capacity.policy import DEFAULT, FIELDS, ScalingPolicy


def _policy(row: dict[str, Any]) -> ScalingPolicy:
    return ScalingPolicy(**{c: row[c] for c in FIELDS})


class ScalingTables:
    if TYPE_CHECKING:

        def _rows(
            self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()
        ) -> list[dict[str, Any]]: ...

        def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any: ...

    def scaling_policy(self, service: str) -> ScalingPolicy:
        rows = self._rows("SELECT * FROM scaling_policies WHERE service = ?", (service,))
        return _policy(rows[0]) if rows else DEFAULT

    def scaling_policies(self) -> dict[str, ScalingPolicy]:
        """Every model whose policy is not the default, by canonical name."""
        return {r["service"]: _policy(r) for r in self._rows("SELECT * FROM scaling_policies")}

    def set_scaling_policy(self, service: str, policy: ScalingPolicy) -> None:
        """Store it (the default removes the row); the caller's transaction."""
        if policy == DEFAULT:
            self._execute("DELETE FROM scaling_policies WHERE service = ?", (service,))
            return
        values = tuple(getattr(policy, c) for c in FIELDS)
        self._execute(
            f"INSERT INTO scaling_policies (service, {', '.join(FIELDS)}) "
            f"VALUES (?{', ?' * len(FIELDS)}) ON CONFLICT(service) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in FIELDS),
            (service, *values),
        )
