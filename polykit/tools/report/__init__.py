"""Reports: a comparison as text and JSON (comparison), a self-contained HTML page (html), and the
per-layer profile of polykit's engine (profile)."""
