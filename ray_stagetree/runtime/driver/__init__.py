"""The driver side: the Tune-compatible `Tuner`, results, callbacks and
progress on the driver, joining the cluster, `Study`. Talks to the
controller through its actor API."""
