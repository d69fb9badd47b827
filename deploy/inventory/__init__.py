"""The inventory wing (controller, pure): YAML → frozen dataclasses, field readers with file:line errors, and `--hosts` selection (the one place that decides the rendezvous host)."""
