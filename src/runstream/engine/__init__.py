"""The functional core: run state, the reducer, the rules, replay of workflow code.

Nothing here does Kafka or RocksDB I/O: it may import ``runstream.schemas`` (records
and the codec) and ``runstream.errors``, never ``topics``, ``projections`` or the shell
(a test enforces it). Every layer above may import it. Step bodies run through
`engine.steps` and workflow code through `engine.replay`, with a time budget from
`engine.budget`; the shell decides when.
"""
