"""The Dagster wiring: resources, assets, checks, sensors, the IO manager and the step failures. Imports the flows, storage and the domain."""
