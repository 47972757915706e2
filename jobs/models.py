"""Training jobs on clusters, their checkpoints and recoveries."""
