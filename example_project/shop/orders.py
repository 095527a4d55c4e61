"""The shop's business code: each change and the posts it causes commit together or not at all."""

from decimal import Decimal

from django.db import transaction

from django_connector_outbox import Link, Message, Outbox
from shop.models import Order

# Where the shop's team talks: a Slack team id and channel id in real life.
WORKSPACE, CHANNEL = "T-SHOP", "C-ORDERS"
# Where the team's mail goes: an email source's container is the recipient's address.
TEAM_MAILBOX = "team@shop.example"
ADMIN_URL = "http://127.0.0.1:8000/admin"


def new_order_message(order: Order) -> Message:
    """One Message for every source: each connector renders it its own way at send time
    (the console and Slack as text or blocks, email as text and HTML, the title its subject)."""
    return Message(
        f"**{order.customer}** placed an order of _{order.total} EUR_.",
        title=f"New order #{order.pk}",
        fields=[("Customer", order.customer), ("Total", f"{order.total} EUR")],
        actions=[
            Link("Its posts in the admin", f"{ADMIN_URL}/django_connector_outbox/post/?q=order-{order.pk}-")
        ],
        context="sent by the example shop",
    )


def place_order(customer: str, total: Decimal, *, customer_message_ts: str) -> Order:
    outbox = Outbox("chat")
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total=total)
        # A new message for the team, in the chat and in its mailbox: one Message, two sources...
        announcement = new_order_message(order)
        outbox.queue(
            f"order-{order.pk}-placed", workspace_id=WORKSPACE, container_id=CHANNEL, body=announcement
        )
        Outbox("mail").queue(
            f"order-{order.pk}-placed", workspace_id="shop", container_id=TEAM_MAILBOX, body=announcement
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
