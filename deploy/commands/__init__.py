"""One module per fab task: each reads like a paragraph (load, plan, execute, render)."""
