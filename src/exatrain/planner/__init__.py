"""The planner: counts (accounting), time (cost) and choice (search). Imports no torch."""
