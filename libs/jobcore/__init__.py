"""jobcore: user-visible background jobs for HTTP APIs.

PostgreSQL holds the product state (jobs, outbox, inbox, leases); RabbitMQ is only the
transport. This package owns everything the three services share.
"""

__version__ = "0.1.0"
