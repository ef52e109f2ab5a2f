"""The web page's cancel button (issue 35, point 4): behind the safeguards of unlocking (read-only
by default, authorize, CSRF) and a box to tick; it asks the running holder to stop and leaves its
place held."""

from __future__ import annotations

import dataclasses

from dramatiq_unique import RedisBackend
from dramatiq_unique.keys import run_key

from .test_web import ROOT, app, client, digest  # noqa: F401 (fixture)


def test_cancel_this_run_asks_the_running_holder_to_stop_once_confirmed(app):  # noqa: F811
    env, _, sent = app
    sync = digest(sent["sync"])
    # Read-only by default: no button.
    assert not [f for f in client(env).get(f"/locks/{sync}").post_forms if "cancel-holder" in f.buttons]
    c = client(env, allow_unlock=True, authorize=lambda environ: True)
    (form,) = [f for f in c.get(f"/locks/{sync}").post_forms if "cancel-holder" in f.buttons]
    assert form.action == ROOT + "/cancel" and form.fields["message_id"] == sent["sync"].message_id
    # Queued holders have none: only a running holder of a run lock can be cancelled.
    assert not [f for f in c.get(f"/locks/{digest(sent['settle'])}").post_forms if "cancel-holder" in f.buttons]

    unconfirmed = dataclasses.replace(form, fields={k: v for k, v in form.fields.items() if k != "confirm"})
    assert c.submit(unconfirmed).status == 400
    forged = dataclasses.replace(form, fields={**form.fields, "csrf": "0" * 64})
    assert c.submit(forged).status == 403
    (held,) = RedisBackend(client=env.backend.client).read([run_key("dramatiq-unique", sync)])[1]
    assert "stop_requested_by" not in held.holder

    answer = c.submit(form)
    assert "Asked 1 running message(s) to stop" in answer.text
    # The place stays held until the message has stopped: no second copy starts meanwhile.
    (held,) = RedisBackend(client=env.backend.client).read([run_key("dramatiq-unique", sync)])[1]
    assert held.holder["stop_requested_by"].startswith("operator an unknown client on the web page of ")
    assert held.holder["message_id"] == sent["sync"].message_id
