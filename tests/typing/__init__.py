"""Files a type checker reads and nothing imports: calls of the public API that must type-check
(``right_calls.py``) and calls that must not (``wrong_calls.py``, each with a comment starting ``E:``);
``tests/unit/test_typed_calls.py`` runs mypy and pyright on them."""
