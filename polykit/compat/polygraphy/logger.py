"""`polygraphy.logger.G_LOGGER`: Polygraphy's severities over the `polykit` logging logger;
`verbosity(level)` is a context manager, as there."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

_LOG = logging.getLogger("polykit")


class Logger:
    ULTRA_VERBOSE, SUPER_VERBOSE, EXTRA_VERBOSE, VERBOSE = 5, 6, 7, logging.DEBUG
    INFO, START, FINISH, WARNING, ERROR, CRITICAL = logging.INFO, logging.INFO, logging.INFO, logging.WARNING, \
        logging.ERROR, logging.CRITICAL

    @property
    def module_severity(self) -> int:
        return _LOG.getEffectiveLevel()

    @module_severity.setter
    def module_severity(self, level: int) -> None:
        _LOG.setLevel(level)

    @contextlib.contextmanager
    def verbosity(self, severity: int = CRITICAL) -> Iterator[None]:
        old = _LOG.level
        _LOG.setLevel(severity)
        try:
            yield
        finally:
            _LOG.setLevel(old)

    def verbose(self, message: Any) -> None:
        _LOG.debug("%s", message)

    def info(self, message: Any) -> None:
        _LOG.info("%s", message)

    def warning(self, message: Any) -> None:
        _LOG.warning("%s", message)

    def error(self, message: Any) -> None:
        _LOG.error("%s", message)

    def critical(self, message: Any) -> None:
        """Polygraphy raises after logging a critical message."""
        _LOG.critical("%s", message)
        raise RuntimeError(str(message))


G_LOGGER = Logger()
