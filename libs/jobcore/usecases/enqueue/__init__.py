"""The enqueue use case: one job, a batch, or in the caller's transaction."""
