"""Admission, the queues, the batches and the one inference thread: how texts reach a forward pass."""
