"""The ways to reach a host, one module each: `base` (what the client
knows), `local` (this machine), `ssh` (OpenSSH). Nothing is imported here:
a run loads only the backend it uses."""
