"""The controller side: the `StudyController` actor's loop over the plan,
its checkpoint store, the study's snapshots, trial names and the resources
the cluster holds. Builds on the worker side."""
