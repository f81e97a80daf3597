"""Where a model comes from: a folder, or a hub id; and the check that a folder named is there.

Standard library only, so that ``__main__`` can refuse a missing folder before the engine's
imports (torch and transformers take seconds): an operator's typo fails at once, with the same
line the engine's loading would give.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from maskserve.config.model_settings import ModelConfig

# What makes a source a path rather than a hub id: a hub id never starts with any of these.
PATH_PREFIXES = ("/", "./", "../", "~")


class ModelLoadError(RuntimeError):
    """The model cannot be served; the message says why, for the operator's log (exit 1)."""


def looks_like_path(source: str) -> bool:
    """Whether ``source`` can only mean a folder: absolute, ``.``/``..``, or starting with
    ``./``, ``../`` or ``~``. A bare ``org/name`` may be either, and stays the hub's to judge."""
    return source in (".", "..") or source.startswith(PATH_PREFIXES) or os.path.isabs(source)


def local_source(source: str) -> str:
    """``source`` as transformers should read it: a path's ``~`` expanded, a hub id unchanged.

    Raises :class:`ModelLoadError` for a path that is missing or not a folder, and for any
    source that names a file. transformers would take the first for a hub id and refuse it by
    the hub's rules for ids, and read the second as a config file, neither of which names the
    operator's mistake.
    """
    expanded = os.path.expanduser(source)
    shown = os.path.abspath(expanded)
    if os.path.isfile(expanded):
        reason = f"{shown} is a file, not a folder: give the model's folder"
    elif not looks_like_path(source) or os.path.isdir(expanded):
        return expanded
    elif os.path.lexists(expanded):
        reason = f"{shown} is not a folder"
    else:
        reason = f"no such folder {shown}"
    raise ModelLoadError(f"could not load model {source!r}: {reason}")


def check_local_sources(configs: Sequence[ModelConfig]) -> None:
    """:func:`local_source` on every model's source, in order; the first refusal names its model
    unless it is the server's only one, as the engine's loading words it."""
    for config in configs:
        if config.source is None:  # the default model, found by its package
            continue
        try:
            local_source(config.source)
        except ModelLoadError as exc:
            if len(configs) == 1:
                raise
            raise ModelLoadError(f"model {config.name!r}: {exc}") from None
