"""Template helpers of the console's pages: sizes, times, capacity, sort links, page links that keep the
other parameters. Values print through ``kinds.formatting``, as in ``kubectl get`` and the plugin's messages."""

from __future__ import annotations

from django import template
from django.utils.html import format_html

from gpustack_models.kinds import formatting

register = template.Library()


@register.filter
def size(value) -> str:
    """``16.0Mi``, ``961B`` (no size reads ``0B``)."""
    return formatting.human_bytes(value or 0)


@register.filter
def when(value) -> str:
    """``2026-12-04T21:48:50Z (5m ago)``: the time in UTC to the second, and how long ago (or ahead) it is."""
    return formatting.timestamp(value, age=True)


@register.filter
def capacity(store) -> str:
    """A node store's (or the stores' sum's) one capacity figure: ``8% of 252.0Gi used (the model cache
    holds 24.0Mi)``."""
    fields = ("total_bytes", "stored_bytes", "used_percent")
    values = [store[f] if isinstance(store, dict) else getattr(store, f) for f in fields]
    return formatting.capacity_text(*values)


@register.simple_tag(takes_context=True)
def with_param(context, name, value) -> str:
    """The current query string with ``name`` set to ``value`` (and the page reset when sorting)."""
    params = context["request"].GET.copy()
    params[name] = value
    if name == "o":
        params.pop("p", None)
    return "?" + params.urlencode()


@register.simple_tag(takes_context=True)
def sort_link(context, column, label) -> str:
    """A column header that sorts by ``column``, descending on a second click."""
    order = context.get("order", "")
    target = f"-{column}" if order == column else column
    arrow = " ▲" if order == column else " ▼" if order == f"-{column}" else ""
    return format_html('<a href="{}">{}{}</a>', with_param(context, "o", target), label, arrow)
