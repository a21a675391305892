"""The Avro contract: the ``.avsc`` files, their typed records (`schemas.records`) and the
single-object codec (`schemas.codec`).

Pure: it imports only fastavro and ``runstream.errors``; anything may import it.
"""
