"""The individual checks behind ``inspect``: each takes what it needs and returns findings."""
