"""Console output, the only code that imports rich (and matplotlib for the report PNG)."""
