"""The `polykit` command: the typer app (app), the CLI's value syntaxes and shared options (args,
coercion), one module per command (run, convert, bench, inspect, surgeon, debug) and --gen-script."""
