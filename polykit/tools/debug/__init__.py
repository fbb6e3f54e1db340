"""Finding what makes a build wrong: `debug tactics`, `debug reduce`, `debug precision`, the searches
they run (tactic_bisect, reduce_search, precision_search), their shared check, text and HTML pages."""
