"""The toolkit: CLI subcommands, comparator, compare functions, data loaders, results I/O, reports."""
