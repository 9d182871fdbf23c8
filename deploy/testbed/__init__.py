"""Laptop testbed: the context-literate SFT cold start and the in-context ability measurements."""
