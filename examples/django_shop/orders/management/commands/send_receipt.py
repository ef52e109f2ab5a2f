"""``manage.py send_receipt ORDER_ID...``: ask for receipts, and say what each send()
did."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from dramatiq_unique import enqueue_outcome
from orders.tasks import send_receipt


class Command(BaseCommand):
    help = "Send the receipt of each order given."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("order_ids", nargs="+", type=int)

    def handle(self, *args: Any, order_ids: list[int], **options: Any) -> None:
        for order_id in order_ids:
            outcome = enqueue_outcome(send_receipt.send(order_id))
            self.stdout.write(f"order {order_id}: {outcome.status}")
