"""Single sign-on: OIDC, SAML and LDAP backends sharing one group → role mapping (docs/AUTH.md).

This package's ``__init__`` and ``mapping``/``config`` modules import no models, so
settings can use them.
"""
