"""The API's in-process fixtures (app, client, keys of two tenants), shared with the API tests."""

from tests.integration.api.conftest import (  # noqa: F401 - fixtures are found by name
    api_app,
    api_client,
    api_key,
    auth,
    other_api_key,
    other_auth,
)
