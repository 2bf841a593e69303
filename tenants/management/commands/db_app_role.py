"""Give the web and worker processes a database role that owns nothing (issue 30, item 2).

Run by the migration step, as the owner, after ``migrate``: the role may read and write
Camp's tables but not the audit log's history — on ``tenants_auditevent`` it may only SELECT,
INSERT and seal (UPDATE of the three chain columns, which the append-only trigger narrows
further). As a non-owner it cannot TRUNCATE, DROP or ALTER any table, nor disable a trigger.
"""

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from psycopg import sql

AUDIT_TABLE = "tenants_auditevent"
SEAL_COLUMNS = ("hash", "prev_hash", "chain_seq")


def grant_statements(role: str) -> list[sql.Composed]:
    r = sql.Identifier(role)
    return [
        sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(r),
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}").format(r),
        sql.SQL("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {}").format(r),
        sql.SQL("REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON {} FROM {}").format(
            sql.Identifier(AUDIT_TABLE), r),
        sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in SEAL_COLUMNS), sql.Identifier(AUDIT_TABLE), r),
    ]


class Command(BaseCommand):
    help = ("Create (if missing) and grant the role web and worker connect as: reads and writes "
            "Camp's tables, owns none, cannot delete or truncate the audit log. Run as the owner "
            "after migrate.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("role", nargs="?", default="")
        parser.add_argument("--password-env", default="APP_DB_PASSWORD",
                            help="Environment variable holding the role's password (create only).")
        parser.add_argument("--from-url-env", default="",
                            help="Take the role and its password from the database URL in this "
                                 "setting (NAME or NAME_FILE), the one web and worker use: "
                                 "docker-compose and the Helm chart's migrations Job.")

    def handle(self, *args: Any, role: str, password_env: str, from_url_env: str, **options: Any) -> None:
        import os
        from urllib.parse import unquote, urlsplit

        from camp.env import env_str

        if connection.vendor != "postgresql":
            raise CommandError("Only PostgreSQL has roles.")
        password_from_url = ""
        if from_url_env:
            url = urlsplit(env_str(from_url_env))
            if not url.username:
                raise CommandError(f"{from_url_env} (or {from_url_env}_FILE) holds no postgres:// URL "
                                   "with a user name.")
            role, password_from_url = unquote(url.username), unquote(url.password or "")
        if not role:
            raise CommandError("Name the role, or give --from-url-env.")
        if role == connection.settings_dict.get("USER"):
            raise CommandError(f"{role} is the role this command runs as (the owner): web and worker "
                               "need a role of their own (docs/DEPLOY.md).")
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if cursor.fetchone() is None:
                password = password_from_url or os.environ.get(password_env, "")
                if not password:
                    raise CommandError(f"Role {role} does not exist; set {password_env} to create it.")
                cursor.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(role), sql.Literal(password)))
            for statement in grant_statements(role):
                cursor.execute(statement)
        self.stdout.write(self.style.SUCCESS(f"Role {role} granted (owns nothing; audit log append-only)."))
