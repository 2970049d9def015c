"""Configuration search: the legal space, its vectorised evaluation, ranking and tuning."""
