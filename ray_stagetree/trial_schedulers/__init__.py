"""Ray Tune's trial schedulers (FIFO, ASHA, HyperBand, median stopping, PBT)
hosted on the search plan: their decisions turned into requests, pauses,
stops and forks.
"""
