"""`bench factual`: the served model's answers against its float32 reference on a fixed factual prompt set."""
