"""The served models behind one handle, and where the server is in its life."""
