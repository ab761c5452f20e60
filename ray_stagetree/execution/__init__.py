"""What running stage batches needs that Ray does not: the controller <->
worker messages (`batches`), a checkpoint's payload and its durable copies
(`payload`, `payload_auth`, `storage`), which checkpoints a trial's folder
keeps (`retention`), RNG state (`rng`) and the accounting of parked
trainables (`parking`). Imports neither Ray nor torch; the runtime builds
on it.
"""
