"""Memory categories: which part of training each allocation belongs to.

One pipeline, bottom to top:
  classify  the rules: a block's categories from the event trace and what the
            torch hooks noted (no torch, no extension)
  report    per-category bytes at the peak, at the end and along the timeline
            (gpumem summary, view, simulate)
  tagger    the torch hooks that note parameters, gradients and optimizer
            state while recording with ``categories=True``, and the table a
            snapshot carries
"""
