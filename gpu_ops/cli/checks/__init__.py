"""`gpu-ops validate` checks, one module per flow."""
