#!/bin/bash
set -e
cd "${APP_DIR:-/app}"
cat > cart.py <<'PY'
def add_item(item, cart=None):
    """Add `item` to `cart` (a new cart when none is given) and return the cart."""
    if cart is None:
        cart = []
    cart.append(item)
    return cart
PY
