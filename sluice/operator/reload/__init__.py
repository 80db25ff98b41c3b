"""Model updates without a restart or a lost record.

A new version of the model -- found by polling its path (``engine.reload.watch``), or asked for by
``sluice reload`` / SIGHUP -- is hashed, checked for memory, built and warmed up beside the serving engine,
off the engine thread (:mod:`.reloader`), then switched to between two batches:

1. the intake takes the ready engine (``Runner`` loop): records it prepares from now on are the new
   engine's, and the records already queued are sealed in the batcher for the old one
   (``SharedState.hand_over``);
2. the engine thread runs the sealed records on the old engine, batch by batch, then switches: the next
   batch is the new engine's (sluice/operator/worker.py). A continuous engine (llm) lets the old engine's
   running requests finish beside the new one's (sluice/operator/continuous.py);
3. the old engine is closed on the reloader's thread.

Records are neither lost nor run twice: a record is prepared by one engine and runs on it, and nothing
about offsets or delivery changes (the ledger and the delivery strategy never see a switch). Each output
and dead letter names its model in the ``sluice.model`` header (sluice/engines/identity.py).

Modules: ``watch`` (when a change has settled; pure), ``memory`` (room for a second engine), ``outcome``
(what an attempt came to), ``reloader`` (the thread and its phases), ``pid_file`` and ``command`` (how
``sluice reload`` finds and signals a running ``sluice run``).
"""
