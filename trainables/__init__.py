"""Trainable APIs for stage execution (installed as ``ray_stagetree.trainables``).

The class API (``StageTrainable``) and the PyTorch helpers arrive with the Ray
runtime; the planning core does not depend on them.
"""
