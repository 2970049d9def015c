"""exatrain: plan, predict and run 3D-parallel training of GPT-style language models.

Layers (kept true by tests/test_layering.py):
  catalog  -> plan  -> planner (accounting, cost, search; never imports torch)
                    -> trainer (torch; never imports the planner)
  cli is the only module that wires planner and trainer together.
"""

__version__ = "0.1.0"
