"""What a client asks for: the OpenAI-style body parsed and checked, the request contract and the
`x-*` headers that narrow it, client JSON Schemas, what reaches the engine, tenant authentication,
`Idempotency-Key` handling and request typing (scenario, language, embeddings).

    openai_request.py    parse and check an OpenAI-style body
    contract.py          the request contract a target must satisfy
    contract_headers.py  the `x-*` headers that narrow a contract
    json_schema.py       client JSON Schemas, checked and validated offline
    engine_fields.py     the allow-list of body fields the local engine gets
    cache_salt.py        per-tenant prefix-cache isolation (`cache_salt`)
    auth.py              tenants, API keys, what a tenant's policy narrows
    idempotency.py       `Idempotency-Key`: a retried request is not billed twice
    typing_rules.py      which scenario an undeclared request belongs to
    embedding.py         text embeddings for request typing, behind a protocol
    language.py          a prompt's script, a stand-in for its language
"""

# The modules of this wing the other wings of router/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("contract", "contract_headers", "openai_request", "auth", "json_schema")
