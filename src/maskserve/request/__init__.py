"""One request's own things: its record, its typed keys, its deadline, and the one path to its task."""
