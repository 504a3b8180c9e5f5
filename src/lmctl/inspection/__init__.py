"""``lmctl data inspect``: what the data looks like to an objective before any training.

A bounded head of each split is read (:mod:`lmctl.inspection.sample`), tokenized in batches
with the run's tokenizer and measured against the objective's length, batch size and
vocabulary (:mod:`lmctl.inspection.measure`); :mod:`lmctl.inspection.report` is the entry point
and renders the findings.
"""
