"""Validators shared by every app (tenancy is the ground floor, so they live here)."""

from __future__ import annotations

import unicodedata

from django.core.validators import RegexValidator

slug_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    "Use lowercase letters, digits and '-' (a DNS label, at most 63 characters).",
)


# --- usernames (issue 31, item 1) -------------------------------------------------------------
# One person, one account: every entrance (login form, LDAP, OIDC, SAML, API, console,
# createsuperuser) reduces a username to one canonical form, so `ｌｅｅ`, `ℓee` and `LEE`
# are all `lee`. Unicode's confusables data is not installed (no such library in the
# requirements), so a new name whose letters mix scripts (`vіctim`: Latin + Cyrillic і) is
# refused; a name wholly in one script is allowed.

# Scripts that are written together in one name (Japanese mixes kanji and kana).
_SCRIPTS_USED_TOGETHER = ({"CJK", "HIRAGANA", "KATAKANA"},)


# One answer, in the API and the console, for a username nobody has and for an account that
# cannot be invited (deactivated): it names neither case, nor echoes the name (issue 30, item 8).
NOT_INVITABLE = "No user who can be invited has this username."


def canonical_username(name: str) -> str:
    """NFKC + case folding (NFKC again after folding, which can denormalise)."""
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold()).strip()


def _script(ch: str) -> str:
    try:
        return unicodedata.name(ch).split(" ", 1)[0]
    except ValueError:
        return "UNKNOWN"


def confusable_username_reason(name: str) -> str | None:
    """Why ``name`` may pass for another person's name, or None (for new accounts)."""
    scripts = {_script(ch) for ch in name if ch.isalpha()}
    if len(scripts) <= 1 or any(scripts <= group for group in _SCRIPTS_USED_TOGETHER):
        return None
    return ("This username mixes letters of several scripts (" + ", ".join(sorted(scripts))
            + "), so it could pass for another person's name.")
