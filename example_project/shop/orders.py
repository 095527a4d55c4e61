"""The shop's business code: each change and the posts it causes commit together or not at all."""

from decimal import Decimal

from django.db import transaction

from django_connector_outbox import Outbox
from shop.models import Order

# Where the shop's team talks: a Slack team id and channel id in real life.
WORKSPACE, CHANNEL = "T-SHOP", "C-ORDERS"


def place_order(customer: str, total: Decimal, *, customer_message_ts: str) -> Order:
    outbox = Outbox("chat")
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total=total)
        # A new message for the team...
        outbox.queue(
            f"order-{order.pk}-placed",
            workspace_id=WORKSPACE,
            container_id=CHANNEL,
            body={"text": f"New order #{order.pk} from {customer}: {total} EUR"},
        )
        # ...a status line that is edited in place as the order moves on...
        outbox.set_status(
            f"order-{order.pk}-status",
            workspace_id=WORKSPACE,
            container_id=CHANNEL,
            body={"text": f"Order #{order.pk}: received"},
        )
        # ...and a reaction on the customer's own message.
        outbox.queue(
            f"order-{order.pk}-ack",
            workspace_id=WORKSPACE,
            container_id=CHANNEL,
            kind="reaction",
            body={"name": "white_check_mark", "timestamp": customer_message_ts},
        )
    return order


def ship_order(order: Order) -> None:
    with transaction.atomic():
        order.shipped = True
        order.save(update_fields=["shipped"])
        Outbox("chat").set_status(
            f"order-{order.pk}-status",
            workspace_id=WORKSPACE,
            container_id=CHANNEL,
            body={"text": f"Order #{order.pk}: shipped"},
        )
