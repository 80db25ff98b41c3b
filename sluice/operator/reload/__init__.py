"""Model updates without a restart or a lost record.

A new version of the model -- found by polling its path (``engine.reload.watch``), or asked for by
``sluice reload`` / SIGHUP -- is hashed, checked for memory, built and warmed up beside the serving engine,
off the engine thread (:mod:`.reloader`), then switched to between two batches:

1. the intake takes the ready engine (``Runner`` loop) and offers it to the engine thread
   (:mod:`.switch`: ``ModelSwitch.offer``; its steps are ``switch.Stage``, reached from the record path
   through two hooks, ``at_intake`` and ``between_batches``);
2. the engine thread, free between two batches, runs what the old engine prepared as its next batch and
   seals the rest in the batcher for it; the intake follows: records are prepared by the new engine from
   then on (a poll's worth the old one prepared meanwhile is prepared again);
3. once the sealed records have run on the old engine, the next batch is the new engine's
   (sluice/operator/worker.py). A continuous engine (llm) lets the old engine's running requests finish
   beside the new one's (sluice/operator/continuous.py);
4. the old engine is closed on the reloader's thread.

Records are neither lost nor run twice: a record is prepared by one engine and runs on it, and nothing
about offsets or delivery changes (the ledger and the delivery strategy never see a switch). Each output
and dead letter names its model in the ``sluice.model`` header (sluice/engines/identity.py).

Modules: ``watch`` (when a change has settled; pure), ``memory`` (room for a second engine), ``outcome``
(what an attempt came to), ``reloader`` (the thread and its phases), ``pid_file`` and ``command`` (how
``sluice reload`` finds and signals a running ``sluice run``).
"""
