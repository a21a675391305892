"""A chaos suite for Runstream's exactly-once claims (issue 20), modelled on Kafka's own
``TransactionsTest`` and Restate's Jepsen suite: ``python -m chaos --minutes N``.

A workload of runs with local and remote steps, a durable timer, a concurrency-limited
step, a child run, a signal and a keyed event runs on a private 3-node cluster (replication
3, ``min.insync.replicas`` 2) while a nemesis SIGKILLs and SIGSTOPs engine instances and
task workers, SIGKILLs and SIGSTOPs brokers, and heals each fault before the next. At the
end it checks only system-wide invariants (`chaos.check`).
"""
