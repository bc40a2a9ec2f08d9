"""Cost models: seconds for compute ops and collectives."""
