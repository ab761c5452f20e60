"""Simulation: the real planner and execution policies on simulated workers,
learning-curve models of whole hyper-parameter schedules, and the Hippo
paper's search spaces.
"""
