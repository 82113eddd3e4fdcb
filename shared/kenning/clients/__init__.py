"""What ``kenning.Client`` does with the database: starts, batched into group-committed
inserts (``starts``), and the waits for results on one shared LISTEN connection
(``results``). Internal: ``kenning.client`` is the public face."""
