"""Training data on disk: tokenizers (Hugging Face ``tokenizers``), ``exatrain prepare``, token shards.

Imports neither torch nor the planner: the trainer reads what this writes (``trainer/sampler.py``).
"""
