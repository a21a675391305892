"""The runtime around the core: the threads, pools, queues and clocks that run it.

Step bodies run here (`runtime.steps`), workflow code gets its time budget here
(`runtime.budget`, an `engine.rules.Activation`), and an instance's internal work waits
here (`runtime.inbox`, with the due times in `runtime.timers`). It may import ``engine``,
``schemas`` and ``runstream.errors``, never ``topics``, ``projections`` or the shell (no
Kafka, no RocksDB); the shell (the worker, the task worker, the testing kit, the CLI)
imports it. The core never does (a test enforces it).
"""
