"""Counts without time: parameters, FLOPs, memory and communication bytes of a layout."""
