"""Recorded experience: episodes to and from datasets.

Importing this package imports neither pyarrow nor msgpack; the functions
that read or write files do, on first use.
"""
__all__: list = []
