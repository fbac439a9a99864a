"""What the table mixins of :class:`letsinfer.store.AuthorityStore` use of
its plumbing: the connection, transactions and counted reads, all defined
in letsinfer/store/authority.py. Only for type checkers: at run time this
class is empty.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from letsinfer.store.connection import Connection


class Plumbing:
    if TYPE_CHECKING:
        db: Connection

        def transaction(self) -> AbstractContextManager[None]: ...

        def _rows(
            self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()
        ) -> list[dict[str, Any]]: ...
