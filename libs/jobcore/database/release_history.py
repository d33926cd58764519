"""jobcore's releases: each one's version, the commit it was cut from and the last
migration revision it shipped.

CI works on a fresh clone that may carry no git tags, so this record, not the tags, is
what the upgrade test (tests/e2e/test_rolling_upgrade.py) builds the previous release
from, and what `jobcore migrate` writes into the database so that processes of an older
release can tell how far ahead the schema is (:mod:`jobcore.database.schema_version`). A release
is cut as CHANGELOG.md says: its entry is added here by the commit after the release's
own (a commit cannot name itself), together with the next development version.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    version: str
    # Full hash: `git archive` of an abbreviated one breaks once the history grows.
    commit: str
    # The head migration revision of the release (alembic's `version_num`).
    revision: str


# Oldest first; append only.
RELEASES: tuple[Release, ...] = (
    Release(version="0.1.0", commit="e6a758e44548152ce980bdf4145cdf8d67df21a2", revision="0019"),
)


def previous_release(own_version: str, releases: tuple[Release, ...] = RELEASES) -> Release | None:
    """The newest recorded release other than ``own_version`` (a release's own code does
    not list itself; a development version lists every release before it)."""
    for release in reversed(releases):
        if release.version != own_version:
            return release
    return None
