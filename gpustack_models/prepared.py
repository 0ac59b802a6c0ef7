"""Querysets compiled to SQL once per process and shape, then run with each request's values.

Django compiles a queryset every time it is evaluated (filters resolved, joins and expressions built,
SQL rendered): on a path that sends the same query on every request, such as the placement webhook on
every Pod create, that compilation costs more than the database does. ``Prepared`` builds the queryset
once from placeholder values, keeps the SQL Django rendered for it, and on each call puts the caller's
values where the placeholders were in the parameters. The queryset stays the one definition (its
manager methods, ``live()``, ``claimed()``); only its compilation is shared.

Placeholders are the builder's string arguments (a list argument becomes one placeholder per item, so
each list length is a shape of its own). A builder must pass each placeholder through unchanged as a
query parameter (``=`` and ``__in`` do; ``__contains`` or ``__iexact`` would rewrite it): compiling
refuses a queryset in which a placeholder does not appear verbatim.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from django.db import connections
from django.db.models import QuerySet

Argument = str | list[str] | tuple[str, ...]
_MARK = "\x00prepared-"


class Prepared:
    """``Prepared(build).rows(*arguments)``: ``build(*arguments).values_list(...)`` as tuples, compiled
    once per database and argument shape."""

    def __init__(self, build: Callable[..., QuerySet]):
        self.build = build
        self._compile = lru_cache(maxsize=32)(self._compiled)

    def rows(self, *arguments: Argument) -> list[tuple]:
        shape = tuple(None if isinstance(a, str) else len(a) for a in arguments)
        alias, sql, slots = self._compile(shape)
        values = [v for a in arguments for v in ((a,) if isinstance(a, str) else a)]
        params = [values[slot] if isinstance(slot, int) else slot.value for slot in slots]
        with connections[alias].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    def _compiled(self, shape: tuple[int | None, ...]) -> tuple[str, str, tuple]:
        count = 0

        def marks(n):
            nonlocal count
            out = [f"{_MARK}{count + i}" for i in range(n)]
            count += n
            return out

        arguments = [marks(1)[0] if n is None else marks(n) for n in shape]
        queryset = self.build(*arguments)
        sql, params = queryset.query.get_compiler(using=queryset.db).as_sql()
        slots: list = []
        seen: set[int] = set()
        for param in params:
            if isinstance(param, str) and param.startswith(_MARK):
                slot = int(param[len(_MARK) :])
                seen.add(slot)
                slots.append(slot)
            else:
                slots.append(_Fixed(param))
        if seen != set(range(count)):
            raise ValueError("a placeholder was rewritten or dropped by the queryset: it cannot be prepared")
        return queryset.db, sql, tuple(slots)


class _Fixed:
    """A parameter the builder fixed itself (a state, a flag): sent as compiled."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value
