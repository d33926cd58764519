"""The API's routes, one module per area; none of them holds SQL."""
