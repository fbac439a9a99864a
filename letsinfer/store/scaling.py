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
        """Every model an operator gave a policy, by canonical name: the ones
        the capacity controller keeps to it (the others keep the groups
        `model install` made)."""
        return {r["service"]: _policy(r) for r in self._rows("SELECT * FROM scaling_policies")}

    def set_scaling_policy(self, service: str, policy: ScalingPolicy) -> None:
        """Store it, the default's values too (an operator's `--min 1 --max 1`
        on a model with two groups means one fewer); the caller's transaction."""
        values = tuple(getattr(policy, c) for c in FIELDS)
        self._execute(
            f"INSERT INTO scaling_policies (service, {', '.join(FIELDS)}) "
            f"VALUES (?{', ?' * len(FIELDS)}) ON CONFLICT(service) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in FIELDS),
            (service, *values),
        )
