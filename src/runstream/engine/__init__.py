"""The functional core: run state, the reducer, replay of workflow code, and decisions.

Nothing here does I/O: it imports neither ``confluent_kafka`` nor ``rocksdict``
(a test enforces it). Records are ``(type name, dict)`` pairs whose fields are
those of the Avro schemas in ``runstream/schemas``.
"""
