"""Dev environments and training jobs arrive with the workloads issue."""
