"""Claims come from a JSON file the tests rewrite, so a test can change a user's groups."""

import json
import os
from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator


class ClaimsFileValidator(OAuth2Validator):
    # "groups" is not a standard claim; release it with the openid scope.
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "openid"}

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        with open(os.environ["IDP_CLAIMS_FILE"], encoding="utf-8") as f:
            claims = json.load(f).get(request.user.username, {})
        return {"preferred_username": request.user.username, **claims}
