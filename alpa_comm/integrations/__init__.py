"""Integrations with other systems. ``alpa`` needs Alpa 0.2.3; ``alpa_translate`` needs nothing."""
