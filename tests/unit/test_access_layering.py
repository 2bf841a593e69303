"""Access is decided by the rules (``can``/``restrict``/``acts_as_platform_admin``), never by a
user's role flags (issue 30, item 5).

A user's ``platform_admin``/``is_platform_admin``/``is_superuser`` flag says what the *account*
may do; an API token may narrow it to one project or to read-only, and only
``tenants.permissions.scope_of`` knows that. A service or view that reads the flag directly
lets a platform admin's project-scoped token act platform-wide (it created presets every
tenant saw). Read from the source with ``ast``: outside the allow-list below, product code
reads these attributes only from a ``Scope`` (``scope.platform_admin``,
``scope_of(user).platform_admin``), which the token has already narrowed.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = ("camp", "camp_cli", "scheduling", "workspaces", "portal", "tenants", "registry")
FLAGS = {"platform_admin", "is_platform_admin", "is_superuser", "is_staff"}

# file -> why reading a user's flag there is right. Keep it short; every entry is a place a
# token's narrowing does not apply.
ALLOWED = {
    # the definitions: the flag itself, and the one place that narrows it by the token
    "tenants/models.py": "defines User.platform_admin from is_platform_admin/is_superuser",
    "tenants/permissions.py": "scope_of() turns the user's flag into the token-narrowed Scope",
    # the account's own attribute, synced as data from the identity provider
    "tenants/sso/services.py": "SSO group sync compares and sets the account's is_platform_admin",
    # the break-glass password login is about the account; no token is involved in it
    "tenants/sso/local.py": "who may use the local break-glass login is a property of the account",
}


def _scope_receiver(node: ast.AST) -> bool:
    """``scope`` / ``self.scope`` / ``scope_of(...)`` / ``permissions.scope_of(...)``."""
    if isinstance(node, ast.Name):
        return "scope" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return "scope" in node.attr.lower()
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name == "scope_of"
    return False


def flag_reads(source: str) -> list[int]:
    """Lines of ``source`` that read a user's role flag outside a Scope."""
    found: list[int] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in FLAGS and isinstance(node.ctx, ast.Load):
            if not _scope_receiver(node.value):
                found.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in {"getattr", "hasattr"} and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value in FLAGS
              and not _scope_receiver(node.args[0])):
            found.append(node.lineno)
    return found


def _allowed(rel: str) -> bool:
    return any(rel == key or rel.startswith(key + "/") for key in ALLOWED)


def test_no_service_or_view_decides_on_a_users_role_flag() -> None:
    offenders = []
    for app in CODE:
        for path in sorted((ROOT / app).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "migrations" in path.parts or _allowed(rel):
                continue
            offenders += [f"{rel}:{line}" for line in flag_reads(path.read_text())]
    assert not offenders, (
        "decide with permissions.can()/restrict()/acts_as_platform_admin() (token-narrowed), "
        f"not the user's flag: {offenders}")


def test_the_allow_list_names_only_files_that_exist() -> None:
    for key in ALLOWED:
        assert (ROOT / key).exists(), key


def test_the_detector_sees_the_patterns_it_forbids() -> None:
    bad = (
        "if not actor.platform_admin:\n    raise X\n"
        "x = getattr(request.user, 'platform_admin', False)\n"
        "y = request.user.is_superuser\n"
    )
    assert sorted(flag_reads(bad)) == [1, 3, 4]
    good = "if scope.platform_admin:\n    pass\nz = scope_of(u).platform_admin\n"
    assert flag_reads(good) == []
