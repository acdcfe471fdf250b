"""Running the suites: the pytest plugin, backend calls, perturbations and metamorphic transforms."""
