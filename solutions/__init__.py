"""Reference solutions of the exercises (the graders must pass on these)."""
