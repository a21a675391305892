"""The functional core: run state, the reducer, the rules, replay of workflow code.

It decides; it never does I/O, starts threads or reads a clock. It may import
``runstream.schemas`` (records and the codec) and ``runstream.errors``, never ``topics``,
``projections``, ``runtime`` or the shell, nor threads, clocks, queues or sockets (tests
enforce it). Every layer above may import it. The runtime (`runstream.runtime`) runs step
bodies and gives workflow code a time budget (an `engine.rules.Activation`); the shell
decides when.
"""
