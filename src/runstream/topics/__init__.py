"""The Kafka edge: the only package that imports ``confluent_kafka`` (besides the local
broker launcher in ``runstream.dev``).

It turns consumed messages into frozen `LogRecord` values and offers the engine a
transactional writer (`topics.kafka.KafkaLog`, behind the `topics.base.EngineLog`
Protocol), the client's producer and reader, the topic admin, the librdkafka log bridge
and the watchdog. It may import ``engine`` (for the record types) and ``schemas``; the
worker, the client, the CLI and the audit import it.
"""
