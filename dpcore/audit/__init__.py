"""The membership-inference audit: attacks, procedures, statistics, its design and its release gate."""
