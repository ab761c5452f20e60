"""The worker side: `StageWorker` actors run stage batches; the trainable's
session (`report`, `get_checkpoint`, ...), class trainables, the config a
trainable sees and stage seeding. Never imports the controller side."""
