"""SCIM 2.0 provisioning (RFC 7643/7644) on django-scim2: docs/AUTH.md, "SCIM provisioning"."""
