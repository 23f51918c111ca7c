"""The operator's traffic controls: the versioned traffic document, graded migrations between targets
and tickets for deferred requests.

    traffic.py    the versioned traffic document
    migration.py  graded migration between targets, with gates
    tickets.py    tickets for deferred requests
"""
