"""How a byte stream to one agent is carried (local, ssh) and how the agent is started."""
