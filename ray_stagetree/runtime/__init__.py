"""The Ray runtime: the Tune-compatible `Tuner`, the study controller actor,
stage workers, the trainable session, checkpoint store and storage, results
and progress.
"""
