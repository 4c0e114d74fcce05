"""Shared pieces for mixture-of-experts systems: a tiny MoE transformer with pluggable expert backends."""
