"""Data files and feeds: saving and loading inputs and outputs (results_io; polykit's .npz and JSON,
Polygraphy's JSON), data loaders, the layerwise output store, and `polykit inspect data`."""
