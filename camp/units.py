"""How Camp writes quantities for people: one definition, used by the portal's template filter
(``portal_tags.mib``) and the console's quota tables (tenancy may not import the portal)."""

from __future__ import annotations

from typing import Any


def mib_words(value: Any) -> str:
    """Memory given in MiB as people read it: GiB (binary, as the cards and Kubernetes count)
    from 1 GiB up, one decimal only when it is not whole, thousands separated:
    1966080 → "1,920 GiB", 2554 → "2.5 GiB", 512 → "512 MiB"."""
    if value is None or value == "":
        return ""
    try:
        n = float(value)
    except (TypeError, ValueError):
        return str(value)
    if abs(n) < 1024:
        return f"{n:,.0f} MiB"
    g = n / 1024
    return f"{g:,.0f} GiB" if abs(g - round(g)) < 0.05 else f"{g:,.1f} GiB"
