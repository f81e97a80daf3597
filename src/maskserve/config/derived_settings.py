"""What the settings imply: values computed from several settings, or from a setting and the
machine, that no flag sets directly.

:class:`~maskserve.config.settings.Settings` takes these as its own methods (it derives from
:class:`DerivedSettings`), so every caller asks the settings object; the fields' declarations, with
their defaults and trade-offs, stay together in ``settings.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from maskserve.config.cpus import available_cpus


class DerivedSettings:
    """The derived values of :class:`~maskserve.config.settings.Settings`, its base class."""

    # The fields these read, declared for the type checker: Settings declares each as a setting
    # (and ``given``, the names the user wrote).
    given: frozenset[str]
    threads: int
    workers: int
    cache_dir: str | None
    max_text_tokens: int
    max_top_k: int
    max_masks_per_text: int
    max_predictions: int

    def masks_allowed(self, tokens: int, model_tokens: int) -> int:
        """The most masks a text of ``tokens`` tokens may hold, on a model that reads ``model_tokens``.

        By default ``--max-masks-per-text`` for each model length of the text, rounded up: a long
        text is read in windows of the model's length, each as costly as a text, so a document holds
        as many masks a window as a sentence does. A value the user set holds for any text.
        """
        if "max_masks_per_text" in self.given:
            return self.max_masks_per_text
        return self.max_masks_per_text * max(1, -(-tokens // model_tokens))

    def text_predictions(self, model_tokens: int) -> int:
        """The most predictions one text may ask for: its masks x top_k, within a request's limit."""
        return min(self.masks_allowed(self.max_text_tokens, model_tokens) * self.max_top_k, self.max_predictions)

    @property
    def max_json_depth(self) -> int:
        """How deeply a JSON body may nest. A valid body nests three levels ({"parameters":
        {"targets": [...]}}); the slack is for "options". Checked before schema validation, whose
        error messages repr the instance recursively: a body nested near Python's recursion limit
        would otherwise end in a 500. Not a setting: no valid request comes near it."""
        return 32

    def resolved_threads(self) -> int:
        """The most threads a forward pass may use: ``--threads``, or this process's share of the
        usable CPUs (all of them with one worker)."""
        return self.threads if self.threads > 0 else max(1, available_cpus() // self.workers)

    def resolved_cache_dir(self, env: Mapping[str, str] | None = None) -> Path:
        """``--cache-dir``, or ``$XDG_CACHE_HOME/maskserve``, or ``~/.cache/maskserve``."""
        if self.cache_dir is not None:
            return Path(self.cache_dir).expanduser()
        xdg = (os.environ if env is None else env).get("XDG_CACHE_HOME", "")
        # The XDG spec ignores a relative XDG_CACHE_HOME.
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
        return base / "maskserve"

    @property
    def adaptive_threads(self) -> bool:
        """Whether small batches run on one torch thread (``--threads 0``, see engine.ThreadPolicy)."""
        return self.threads == 0
