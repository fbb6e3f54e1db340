"""Comparing runners: the comparator, compare functions, a model to an accuracy verdict (accuracy)
and the first divergence of a layerwise comparison."""
