"""The previous release's module paths that applications import stay importable, as the
very modules of the new layout, with a DeprecationWarning naming the new path."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from jobcore.kernel.old_paths import OLD_PATHS


@pytest.mark.parametrize(("old", "new"), sorted(OLD_PATHS.items()))
def test_an_old_path_is_the_new_module(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert any(
        issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in caught
    ), [str(w.message) for w in caught]


def test_a_job_module_written_for_the_previous_release_declares_its_types() -> None:
    sys.modules.pop("jobcore.registry", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from jobcore.registry import job  # type: ignore[import-not-found]
    from jobcore.execution.registry import job as new_job

    assert job is new_job


def test_a_path_that_never_existed_is_not_invented() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("jobcore.no_such_module")
