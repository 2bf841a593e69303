"""Camp settings: one module per integration, all read from the environment.

``camp.settings`` is the default (demo / development: SQLite, no servers needed).
``camp.settings.production`` hardens it; ``camp.settings.test`` points at the
real PostgreSQL and Redis the test suite uses.
"""

from .api import *  # noqa: F403
from .auth import *  # noqa: F403
from .base import *  # noqa: F403
from .database import *  # noqa: F403
from .scim import *  # noqa: F403
from .tasks import *  # noqa: F403
