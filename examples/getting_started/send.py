import logging

from tasks import send_welcome_email

from dramatiq_unique import enqueue_outcome

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

first = send_welcome_email.send(42)
second = send_welcome_email.send(42)  # the sign-up form was submitted twice

for message in (first, second):
    outcome = enqueue_outcome(message)
    print(f"{message.message_id}: {outcome.status}, lock held by {outcome.holder}")
