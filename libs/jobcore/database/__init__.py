"""PostgreSQL: the one way in, the schema and its migrations, the statements and their
owners.

- :mod:`.gateway`: the explicitly opened pool, sessions and units of work; every named
  statement runs through its ``execute`` / ``fetch_one`` / ``fetch_all``;
- :mod:`.statement_spans`: a span per statement, named by the statement;
- :mod:`.sql`: the named statements, a module per table they change;
- :mod:`.store`: the stores, which run those statements for the rest of the code;
- :mod:`.schema`: the tables as SQLAlchemy Core metadata (what the migrations must build);
- :mod:`.table_names`: their names, for serving processes that need no SQLAlchemy;
- :mod:`.migrate`: bringing a database to the schema head with Alembic;
- :mod:`.migration_steps`: steps the migrations share (indexes built CONCURRENTLY);
- :mod:`.schema_version`: which schemas this release runs against (rolling upgrades);
- :mod:`.release_history`: jobcore's own releases and the last migration each shipped.
"""
