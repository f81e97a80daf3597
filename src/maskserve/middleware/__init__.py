"""Request middlewares, one per file; the chain, its stages and their order live in :mod:`.chain`."""
