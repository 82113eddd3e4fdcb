"""``kenning bench``: honest numbers, each beside a limit measured in the same run."""
