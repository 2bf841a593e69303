"""Authentication: local accounts with django-axes login throttling."""

from camp.env import env_int

AUTHENTICATION_BACKENDS = [
    # AxesStandaloneBackend must come first: it refuses locked-out credentials.
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

# Lock an account+IP pair after N failures; a success resets it (django-axes).
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = env_int("LOGIN_COOLOFF_MINUTES", 15) / 60  # hours
AXES_LOCKOUT_PARAMETERS = [["username"], ["ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False
# Never store the attempted password; axes stores the username and IP only.
AXES_SENSITIVE_PARAMETERS = ["password"]
