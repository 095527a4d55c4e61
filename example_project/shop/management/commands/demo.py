"""``manage.py demo place|ship``: business changes that queue posts in their own transactions."""

from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from shop.models import Order
from shop.orders import place_order, ship_order


class Command(BaseCommand):
    help = "Place two demo orders, or ship the oldest unshipped one; run_outbox then delivers the posts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("step", choices=["place", "ship"])

    def handle(self, *args: Any, step: str, **options: Any) -> None:
        if step == "place":
            first = place_order("Ada", Decimal("42.00"), customer_message_ts="1700000000.000100")
            second = place_order("Grace", Decimal("7.50"), customer_message_ts="1700000000.000200")
            self.stdout.write(f"Placed orders #{first.pk} and #{second.pk}; their posts are queued.")
            return
        order = Order.objects.filter(shipped=False).order_by("pk").first()
        if order is None:
            self.stdout.write("Nothing to ship.")
            return
        ship_order(order)
        self.stdout.write(f"Shipped order #{order.pk}; its status post will be edited in place.")
