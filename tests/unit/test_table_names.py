"""The names a serving process reads without SQLAlchemy are the metadata's."""

from jobcore.database.schema import metadata
from jobcore.database.table_names import HOT_TABLES, TABLES


def test_the_table_list_is_every_table_of_the_metadata() -> None:
    assert list(TABLES) == sorted(metadata.tables)


def test_hot_tables_are_tables_of_the_metadata() -> None:
    assert set(HOT_TABLES) <= set(metadata.tables)
