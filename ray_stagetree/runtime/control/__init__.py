"""The controller side: the batch loop over a plan (`batch_loop.BatchLoop`),
the studies on it (`study_trials.StudyTrials`), the `StudyController` actor
(a loop with one study), and the managers they compose: the checkpoint
store, snapshots, trial names, the resources the cluster holds. Builds on
the worker side."""
