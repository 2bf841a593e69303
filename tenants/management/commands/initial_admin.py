"""``manage.py initial_admin``: the first platform admin from the deployment's settings.

Run by the Helm chart's migrations Job (``initialAdmin`` values) and compose's ``migrate``
service after ``migrate``, on every install and upgrade: it creates the user only when no
user of that name exists, so a password changed since (in the console) is never reset, and
it is a no-op when no username is configured.

The password comes from ``CAMP_ADMIN_PASSWORD`` or, better, ``CAMP_ADMIN_PASSWORD_FILE`` (a
mounted Secret), never from the command line; Django's password validators apply.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, transaction

from camp.env import env_str
from tenants.audit import audit_record, snapshot
from tenants.models import User
from tenants.services import USER_FIELDS

ACTOR = "initial_admin"


class Command(BaseCommand):
    help = ("Create the platform admin named by CAMP_ADMIN_USERNAME with CAMP_ADMIN_PASSWORD(_FILE) "
            "if no such user exists; never changes an existing user. No username: nothing to do.")

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="", help="Default: CAMP_ADMIN_USERNAME(_FILE).")
        parser.add_argument("--email", default="", help="Default: CAMP_ADMIN_EMAIL.")

    def handle(self, *args: Any, username: str, email: str, **options: Any) -> None:
        username = (username or env_str("CAMP_ADMIN_USERNAME")).strip()
        email = (email or env_str("CAMP_ADMIN_EMAIL")).strip()
        if not username:
            self.stdout.write("No initial admin configured (CAMP_ADMIN_USERNAME): nothing to do.")
            return
        if User.objects.filter(username=username).exists():
            self.stdout.write(f"User {username} exists: left as it is (its password is never reset here).")
            return
        password = env_str("CAMP_ADMIN_PASSWORD")
        if not password:
            raise CommandError(f"No user {username} yet and no CAMP_ADMIN_PASSWORD(_FILE) to create it with.")
        user = User(username=username, email=email, is_platform_admin=True)
        try:
            validate_password(password, user)
        except ValidationError as exc:
            raise CommandError("CAMP_ADMIN_PASSWORD is refused: " + " ".join(exc.messages)) from exc
        user.set_password(password)
        try:
            with transaction.atomic():
                user.save()
                audit_record(actor=None, actor_username=ACTOR, action="user.created", target=user,
                             after=snapshot(user, USER_FIELDS))
        except IntegrityError:  # another run created it meanwhile (two Jobs at once)
            self.stdout.write(f"User {username} exists: left as it is (its password is never reset here).")
            return
        self.stdout.write(self.style.SUCCESS(f"Created platform admin {username}."))
