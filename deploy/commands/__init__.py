"""One module per fab task, holding all of its behaviour: load, select, plan, execute, render. Flags and help live in deploy/tasks.py."""
