"""The logical plan: nodes, validation, JSON and explain."""
