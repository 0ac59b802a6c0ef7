"""Template helpers of the console's pages: sizes, sort links, page links that keep the other parameters."""

from __future__ import annotations

from django import template
from django.utils.html import format_html

from gpustack_models.kinds.formatting import human_bytes

register = template.Library()


@register.filter
def size(value) -> str:
    return human_bytes(value or 0) + "B" if value and value >= 1024 else f"{value or 0} B"


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
