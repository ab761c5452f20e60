"""The planning core: trial configurations, the search plan, stage trees,
execution policies, the cost model and merge rates.

Pure Python: nothing here imports Ray, so planning can be tested and
benchmarked without starting it.
"""
