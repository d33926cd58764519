"""PostgreSQL: the gateway, the schema, its migrations, statements and stores."""
