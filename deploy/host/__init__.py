"""Code that runs on the hosts: standard library only (started by the controller over SSH)."""
