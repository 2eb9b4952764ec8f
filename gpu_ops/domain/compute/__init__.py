"""GPU requests, the accelerator catalog, Kubernetes names, the backend interface and the fence between a GPU lease and its workers."""
