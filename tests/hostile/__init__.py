"""Hostile and malformed inputs, as a declarative table (``corpus.CASES``)."""
