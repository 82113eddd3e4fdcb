"""Example applications shipped with Kenning; ``kenning up`` runs ``kenning.examples.orders``
unless ``--app`` names another."""
