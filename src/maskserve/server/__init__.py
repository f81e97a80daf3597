"""The process: one server (serve.py) or several on one port under gunicorn (workers.py)."""
