"""A finished run's public results: summary tables and plots."""
