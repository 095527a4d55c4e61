"""``manage.py demo place|ship|admin``: business changes that queue posts in their own
transactions, and a login for the admin, where an operator sees what was delivered."""

import secrets
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from shop.models import Order
from shop.orders import place_order, ship_order


class Command(BaseCommand):
    help = (
        "Place two demo orders, or ship the oldest unshipped one (run_outbox then delivers the "
        "posts); or give the superuser 'admin' a new random password and say how to log in."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("step", choices=["place", "ship", "admin"])
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="where runserver serves the site")

    def handle(self, *args: Any, step: str, url: str, **options: Any) -> None:
        if step == "admin":
            self.admin_login(url)
            return
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

    def admin_login(self, url: str) -> None:
        # A new random password on every run: the demo never ships a known one.
        password = secrets.token_urlsafe(12)
        user, _ = get_user_model().objects.get_or_create(username="admin")
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        posts = f"{url}/admin/django_connector_outbox/post/"
        self.stdout.write(
            f"Log in at {url}/admin/ as admin, password {password}\n"
            f"  posts that need an operator (queued, sending, failed, uncertain): {posts}\n"
            f"  the posts just delivered: {posts}?state=posted"
        )
