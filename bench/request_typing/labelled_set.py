"""A small labelled set for request typing (tests/unit/test_typing.py, bench/request_typing/embeddings.py): examples
with the scenario a person would give them (None: none of the typed scenarios, the default)."""

from __future__ import annotations

POLICY = {
    "version": "typing-1",
    "default_scenario": "default",
    "scenarios": {
        "default": {"level": "L2"},
        "extraction": {"level": "L1"},
        "code": {"level": "L2", "strategy": "latency"},
        "support": {"level": "L2", "strategy": "cost"},
        "open": {"level": "L3"},  # looser than the default: typing may never pick it
    },
}

EXAMPLES = {
    "extraction": [
        "Extract the invoice number, date and total amount from this invoice text.",
        "Pull the names, emails and phone numbers out of the following document.",
        "Extract all product names and prices from this receipt as fields.",
        "From the contract below, extract the parties, start date and termination clause.",
        "Extract the address fields (street, city, postcode) from this letter.",
    ],
    "code": [
        "Write a Python function that reverses a linked list.",
        "Fix the bug in this JavaScript function: it returns undefined.",
        "Refactor this Java class to use dependency injection.",
        "Why does my Python code raise a KeyError in this loop?",
        "Write a SQL query that counts orders per customer.",
    ],
    "support": [
        "My order has not arrived yet, where is my package?",
        "I want a refund for the damaged item I received.",
        "How do I reset the password of my account?",
        "I was charged twice for my subscription, please help.",
        "Can I change the delivery address of my order?",
    ],
}

HELD_OUT: list[tuple[str, str | None]] = [
    ("Extract the sender name and the invoice total from this email.", "extraction"),
    ("Extract every date and amount mentioned in this bank statement.", "extraction"),
    ("Pull the company names and addresses out of this document.", "extraction"),
    ("Extract the fields name, email, phone from the signup form text.", "extraction"),
    ("Write a Python function that merges two sorted lists.", "code"),
    ("Fix this bug: my JavaScript function returns NaN for empty arrays.", "code"),
    ("Why does my Java code throw a NullPointerException?", "code"),
    ("Write a SQL query that finds customers without orders.", "code"),
    ("Where is my order? The package has not arrived.", "support"),
    ("I want a refund, the item arrived broken.", "support"),
    ("I forgot my password and cannot log in to my account.", "support"),
    ("I was charged twice this month for my subscription.", "support"),
    ("Tell me a story about a dragon who learns to sing.", None),
    ("What is the capital of France?", None),
    ("Summarise the plot of Hamlet in three sentences.", None),
    ("Give me three ideas for a birthday party.", None),
]
