"""Multi-seed method grids: `python -m deploy experiment run --grid FILE` trains every
(arm, seed) of a grid file as its own run, resumably, and `experiment report` turns the per-run JSON under
results/<grid>/ into a table, paired differences and learning curves (docs/testbed.md "Running a grid")."""
