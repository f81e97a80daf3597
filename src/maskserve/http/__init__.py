"""The HTTP app: its factory (app.py), the route table (routes.py) and the load agent it starts (agent.py)."""
