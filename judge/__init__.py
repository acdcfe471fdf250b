"""Judging: from a backend's output and its golden to a verdict (metrics, policies, deviations)."""
