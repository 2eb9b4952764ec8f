"""Budget alert flows: channels, enforcement, the forecast gate, intraday accrual and anomalies."""
