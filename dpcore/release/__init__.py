"""The audited release, and using a release: predict locally, through an endpoint, or export it."""
