"""The schema check's revision graph, read from the migration files without Alembic, is
Alembic's own: the same revisions, the same head, the same ancestors of each."""

from __future__ import annotations

from alembic.config import Config
from alembic.script import ScriptDirectory

from jobcore.database import schema_version
from jobcore.database.migrate import migrations_dir


def _alembic() -> ScriptDirectory:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return ScriptDirectory.from_config(config)


def test_the_graph_read_from_the_files_is_alembics() -> None:
    script = _alembic()
    assert schema_version.known_revisions() == {s.revision for s in script.walk_revisions()}
    assert schema_version.own_head() == script.get_current_head()
    graph = schema_version._revisions()
    for revision in schema_version.known_revisions():
        expected = {s.revision for s in script.iterate_revisions(revision, "base")}
        assert graph.ancestors(revision) == expected, revision
