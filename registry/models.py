"""Container images and registry credentials arrive with the workloads issue."""
