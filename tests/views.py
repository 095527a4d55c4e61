"""Async views that queue posts, as a project's ASGI views would (tests/test_outbox_async.py)."""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest, JsonResponse

from django_connector_outbox import Outbox

PLACE = {"workspace_id": "T1", "container_id": "C1"}


async def queue_post(request: HttpRequest) -> JsonResponse:
    """The a-methods, awaited in the view."""
    outbox = Outbox("memory")
    post_id = request.POST["post_id"]
    queued = await outbox.aqueue(post_id, **PLACE, body={"text": request.POST["text"]})
    found = await outbox.afind(post_id)
    return JsonResponse({"queued": queued, "state": found.state if found else None})


async def queue_post_sync(request: HttpRequest) -> JsonResponse:
    """The sync method in an async view: Django refuses it (SynchronousOnlyOperation)."""
    Outbox("memory").queue(request.POST["post_id"], **PLACE, body={"text": "never"})
    return JsonResponse({"queued": True})


def _sign_up(username: str, fail: bool) -> None:
    # One transaction for the business row and its post: an atomic block cannot span awaits,
    # so it lives in a sync function run by sync_to_async.
    with transaction.atomic():
        User.objects.create(username=username)
        Outbox("memory").queue(f"welcome:{username}", **PLACE, body={"text": f"Welcome {username}"})
        if fail:
            raise ValueError("payment refused")


async def sign_up(request: HttpRequest) -> JsonResponse:
    """A business row and its post in one transaction, from an async view."""
    try:
        await sync_to_async(_sign_up)(request.POST["username"], bool(request.POST.get("fail")))
    except ValueError as e:
        return JsonResponse({"error": str(e)}, status=409)
    return JsonResponse({"ok": True})
