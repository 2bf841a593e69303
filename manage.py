#!/usr/bin/env python
"""Django's command-line utility for Camp."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "camp.settings")
    from django.core.management import execute_from_command_line

    from camp.env import ImproperlyConfiguredEnv

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfiguredEnv as exc:  # a setting that cannot work: one line naming it
        print(f"camp: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
