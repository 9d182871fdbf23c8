"""Laptop tooling: the tiny model built offline (`tiny_model`), the supervised cold start on expert
demonstrations (`sft`) and the five-stage embedded demo (`demo`). Nothing in a training step
depends on these."""
