"""What the simulated provider checks and enforces beyond answering: the context window and assistant prefill
(`prefill.py`), the account's rate limits and their headers (`account_limits.py`)."""
