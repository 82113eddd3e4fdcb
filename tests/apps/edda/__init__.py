"""Edda 0.1.0's own example programs, ported to Kenning with the fewest changes (the issue 27
port: ``tests/system/test_edda_examples.py`` runs each one's ``main()`` and a worker).

Each file says where it came from and what changed. Edda is MIT-licensed, Copyright (c)
2025 Yasushi Itoh (https://github.com/i2y/edda, tag v0.1.0)."""
