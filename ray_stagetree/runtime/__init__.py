"""The Ray runtime, in four rooms, each importing only those before it:
`workers` (what runs on a stage worker), `control` (the study controller
actor), `service` (plan services) and `driver` (the Tune-compatible
`Tuner`, results and callbacks). What needs no Ray lives below, in
`ray_stagetree.execution`.
"""
