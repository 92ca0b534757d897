"""Running things on nodes: SSH (paramiko) for a fleet, a local transport for the sandbox."""
