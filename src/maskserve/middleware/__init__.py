"""Request middlewares, one per file; the chain and its order live in :mod:`maskserve.app`."""
