"""Configuration search: the legal space, its vectorised evaluation and ranking (tuning by real runs:
exatrain.tuning)."""
