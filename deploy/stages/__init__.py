"""The method stages of a training step, each pure over the actors it is handed:
`smrc_sd` (routing: references, turn matching, teacher prompts for SMRC-SD and its baselines),
`uniskill_glue` (UniSkill's pure per-stage functions) and `uniskill` (those functions bundled with
the bank, critic and proposal generator). Stages never import the CLI, the runner or analysis."""
