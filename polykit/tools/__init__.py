"""The toolkit, by job: cli/ (the `polykit` command), compare/, data/, debug/, report/, bench/,
model/ (surgeon and inspect); builtin registers polykit's own compare functions, data loaders and
readers and commands through the plugin hooks, conformance runs ONNX's backend test suite."""
