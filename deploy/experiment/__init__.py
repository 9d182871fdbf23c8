"""Multi-seed method grids: `python -m deploy experiment run --grid FILE` trains every
(arm, seed) of a grid file as its own run, resumably, and `experiment report` turns the per-run JSON under
RESULTS/ into a table, paired differences and learning curves (docs/testbed.md "Running a grid").
RESULTS is runs/experiments/<grid>/results/ by default and the committed results/<grid>/ with --publish
(`grid.default_dirs`)."""
