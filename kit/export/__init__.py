"""Exports of sealed runs to the tools their users read them in (MLflow)."""
