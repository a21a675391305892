"""The RocksDB shell: the only package that imports ``rocksdict``.

A projection is a cache of one journal partition; the journal is the truth. It may
import ``engine`` (to fold facts) and ``schemas``; the worker imports it.
"""
