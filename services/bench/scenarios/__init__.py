"""One module per `jobcore bench` scenario: TITLE, steps(options) and run(bench)."""
