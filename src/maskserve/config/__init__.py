"""The settings: every flag and variable, and the models served by name."""
