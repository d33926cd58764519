"""The module paths of the previous release that applications name, kept importable.

Handler modules, schedules and tests import from jobcore (``from jobcore.registry import
job``), and during a rolling upgrade one job module is loaded by processes of both
releases, so a module's old path must keep working while the previous release runs. Each
old path below is the same module object as its new one (``jobcore.registry is
jobcore.execution.registry``), imported with a DeprecationWarning that names the new path.
Installed on ``sys.meta_path`` by the package's ``__init__``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

# Old path → new path, for the modules the previous release's documentation had
# applications import (job types, flow control, schedules, settings, errors, results, the
# in-transaction enqueue); the library's other modules were internal.
OLD_PATHS: dict[str, str] = {
    "jobcore.errors": "jobcore.kernel.errors",
    "jobcore.states": "jobcore.kernel.states",
    "jobcore.settings": "jobcore.kernel.settings",
    "jobcore.priorities": "jobcore.kernel.priorities",
    "jobcore.retry": "jobcore.kernel.retry",
    "jobcore.gates": "jobcore.kernel.gates",
    "jobcore.quotas": "jobcore.kernel.quotas",
    "jobcore.registry": "jobcore.execution.registry",
    "jobcore.handlertx": "jobcore.execution.transaction",
    "jobcore.jobprogress": "jobcore.execution.progress",
    "jobcore.results": "jobcore.storage.results",
    "jobcore.schedules": "jobcore.maintenance.periodic",
    "jobcore.in_transaction": "jobcore.usecases.enqueue.in_transaction",
    "jobcore.db": "jobcore.database.gateway",
    "jobcore.jobtypes": "jobcore.examples.jobtypes",
    "jobcore.demojobs": "jobcore.examples.demo",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path is kept for the previous "
            "release's code and will go",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The new module ran already: nothing to execute."""


class OldPaths(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = OLD_PATHS.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(finder, OldPaths) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldPaths())
