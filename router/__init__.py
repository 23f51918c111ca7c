"""The routing domain, pure and the bottom layer: one sub-package ("wing") per feature.

    request/     what a client asks for: the parsed body, the contract, auth, idempotency, typing
    routing/     where a request goes: plan, pipeline, policy, capabilities, saturation, burst
    limits/      spend and rate limits: budget, provider quotas, tenant rate limits
    resilience/  when targets fail: breakers, failures, retries, health, continuation, tiers
    sessions/    conversations across turns: ids, pins, history, anchors, compression
    traffic/     the operator's traffic controls, migrations, deferred-request tickets
    learning/    decision records, feedback, quality, offline replay
    output/      checking answers: output contracts, reassembled streams, loops

The shared core stays here: errors.py and error_codes.py (the one error hierarchy and its codes),
headers.py (every HTTP header name), settings_base.py (the strict settings base), percentile.py.
"""
