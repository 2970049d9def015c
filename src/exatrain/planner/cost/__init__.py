"""Time without hardware in the loop: compute, network and pipeline-schedule models of one step."""
