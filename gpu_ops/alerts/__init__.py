"""Budget alerts and enforcement.

- ``state``: the per budget × threshold × period state machine (pure).
- ``model`` / ``messages``: the alert value and each channel's body, webhook signing (pure).
- ``channels``: delivery with retries and secret redaction (gpu_ops.bounded_http, smtplib; no Dagster).
- ``enforcement``: NodePool throttle/block plans, the enforcement record, the launch gate.
- ``records``: the tables read (budget status, attribution) and written (deliveries).
- ``sensor``: the Dagster wiring: `budget_alert_sensor`, `budget_alert_job`,
  `budget_enforcement_job`; ``definitions.build_defs`` registers them.
- ``checks``: the `gpu-ops validate` check for channel secrets; ``cli``: `gpu-ops alerts`.
"""
