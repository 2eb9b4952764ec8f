"""GPU requests, the accelerator catalog, Kubernetes names and the backend interface."""
