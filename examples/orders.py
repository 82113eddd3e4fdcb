"""The order saga, as ``examples.orders``: it ships in the package as
``kenning.examples.orders`` (shared/kenning/examples/orders.py), which ``kenning up`` runs by default;
this module re-exports it for ``--app examples.orders`` (compose.yaml, the docs)."""

from kenning.examples.orders import (
    COOLING_OFF,
    PAYMENT_LOOKBACK,
    PAYMENT_TIMEOUT,
    Item,
    OrderCreated,
    PaymentCompleted,
    app,
    capture_payment,
    order_saga,
    refund_payment,
    release_inventory,
    request_payment,
    reserve_inventory,
    ship,
)

__all__ = [
    "COOLING_OFF",
    "PAYMENT_LOOKBACK",
    "PAYMENT_TIMEOUT",
    "Item",
    "OrderCreated",
    "PaymentCompleted",
    "app",
    "capture_payment",
    "order_saga",
    "refund_payment",
    "release_inventory",
    "request_payment",
    "reserve_inventory",
    "ship",
]
