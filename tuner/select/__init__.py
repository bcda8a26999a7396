"""Choosing a config without measuring: selectors, their corpus, shipped files; may import tuner.measure and below."""
