"""Choosing a config without measuring: the selectors, their corpus, shipped files; imports tuner.measure and below."""
