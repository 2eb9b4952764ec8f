"""Budget alert models, the alert state machine, the delivery queue and messages."""
