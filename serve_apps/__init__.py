"""Ray Serve and HTTP: the deployments, the gateway and everything that awaits, one sub-package ("wing")
per feature:

    http/        the gateway's HTTP surface: routes, the error edge, guards, the proxy's byte limits,
                 OpenAPI, readiness, model cards, `Idempotency-Key`
    dispatch/    one request's dispatch: the dispatcher, its walk over the candidates, the calls, the
                 record, admission and the live workload mix
    streams/     answers as they arrive: a stream counted, checked, booked and continued; the output
                 contract and the loop check on a complete answer
    sessions/    conversations across turns: the dispatcher's side, the pin table, history, summaries
    traffic/     the operator's traffic controls: board, routes, wiring, live scores and weights, the
                 standby's dry-run, degradation tiers and deferred tickets
    resilience/  the resilience state, probes, the start-up golden check, learnt context windows, the
                 breakers shared between replicas, the operator routes
    learning/    the learning state, its routes, decision records over HTTP and the decision log's file
    limits/      the spend ledger and the per-tenant concurrency limit and monthly budget
    off_loop/    work kept off the event loop: the tenant-fair check pool, the background writer
    telemetry/   engine stats from replica to gateway (pusher, board, reader), metrics, structured logs
    engine/      the local models: LLMConfig, the model replica and its engine's checks, replica choice,
                 the gateway's backend over Ray handles, Ray's own ingress for `bench overhead`
    providers/   adapters to cloud providers

The composition stays here: app.py (the Serve application), gateway.py (the ingress deployment),
gateway_build.py and gateway_parts.py (every part of a gateway replica, built once, and its bundles),
runner.py (deploy and wait); with the shared core every wing uses: backend.py (the backend protocols and
their one reply), clocks.py (the injected clocks and sleep), head_actor.py (the head node's named actors).
"""
