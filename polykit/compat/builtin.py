"""polykit.compat as a built-in plugin: when the CLI starts (its polykit_cli_commands hook) the
`polygraphy` alias is installed, unless Polygraphy is, so that user scripts the CLI runs
(`--data-loader-script`) may `from polygraphy.json import save_json`. Python programs that
import polykit get no alias: they call polykit.compat.install_polygraphy_alias() themselves."""

from __future__ import annotations

from typing import Any

from polykit.compat import install_polygraphy_alias
from polykit.plugins import hookimpl


@hookimpl
def polykit_cli_commands(app: Any) -> None:
    install_polygraphy_alias()
