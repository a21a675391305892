"""Development tooling, off the engine's runtime path: a local Kafka from Maven jars.

Nothing in the engine, the client or the core imports this package; the CLI's
``runstream kafka`` commands, the test fixtures and the benchmarks do. It may import
``confluent_kafka`` (to probe the broker it started).
"""
