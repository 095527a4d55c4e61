"""The producers' async twins (aqueue ...), awaited in async code and under ASGI requests.

Django refuses the database from an event loop's thread; each a-method runs its sync method
in the thread that holds the request's connection, so it sees (and joins) that thread's
transaction, as Django's own a-methods do.
"""

from __future__ import annotations

from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import User
from django.core.exceptions import SynchronousOnlyOperation
from django.test import TestCase, TransactionTestCase

from django_connector_outbox import InvalidPost, Outbox, PostState
from django_connector_outbox.testing import deliver_due, queued

PLACE = {"workspace_id": "T1", "container_id": "C1"}


class AsyncTwinsTests(TestCase):
    async def test_aqueue_queues_once_per_post_id_like_queue(self):
        outbox = Outbox("memory")

        assert await outbox.aqueue("p1", **PLACE, body={"text": "hi"}) is True
        assert await outbox.aqueue("p1", **PLACE, body={"text": "again"}) is False
        assert await outbox.afind("p1") == PostState("queued", None)
        assert await outbox.afind("nope") is None

    async def test_aqueue_refuses_bad_input_as_queue_does(self):
        with self.assertRaisesMessage(
            InvalidPost, "post 'p1': kind 'status' is queued with set_status(), not queue()"
        ):
            await Outbox("memory").aqueue("p1", **PLACE, kind="status", body={"text": "x"})

    async def test_aqueue_many_queues_all_or_nothing(self):
        outbox = Outbox("memory")
        posts = [{"post_id": f"m{i}", **PLACE, "body": {"text": str(i)}} for i in range(3)]

        assert await outbox.aqueue_many(posts) == 3
        with self.assertRaises(InvalidPost):
            await outbox.aqueue_many(
                [{"post_id": "m9", **PLACE, "body": {}}, {"post_id": "", **PLACE, "body": {}}]
            )
        assert await outbox.afind("m9") is None

    async def test_aset_status_creates_then_replaces_the_body(self):
        outbox = Outbox("memory")

        await outbox.aset_status("s1", **PLACE, body={"text": "1/2"})
        await outbox.aset_status("s1", **PLACE, body={"text": "2/2"})

        [waiting] = await _queued()
        assert (waiting.post_id, waiting.body) == ("s1", {"text": "2/2"})

    async def test_acancel_queued_cancels_a_queued_post_only(self):
        outbox = Outbox("memory")
        await outbox.aqueue("p1", **PLACE, body={"text": "hi"})

        assert await outbox.acancel_queued("p1") is True
        assert await outbox.acancel_queued("p1") is False
        assert await outbox.afind("p1") == PostState("cancelled", None)

    async def test_aretract_retracts_once_like_retract(self):
        outbox = Outbox("memory")
        await outbox.aqueue("p1", **PLACE, body={"text": "hi"})
        await sync_to_async(deliver_due)("memory")

        assert await outbox.aretract("p1") is True
        assert await outbox.aretract("p1") is False
        assert (await outbox.afind("p1:delete")).state == "queued"

    async def test_ahas_reply_for_turn_sees_the_turns_replies(self):
        outbox = Outbox("memory")
        await outbox.aqueue("reply:1", **PLACE, body={"text": "hi"}, turn_key="turn-1")

        assert await outbox.ahas_reply_for_turn("turn-1") is True
        assert await outbox.ahas_reply_for_turn("turn-1", prefix="other:") is False
        assert await outbox.ahas_reply_for_turn("turn-2") is False

    async def test_the_sync_method_is_refused_in_async_code(self):
        with self.assertRaises(SynchronousOnlyOperation):
            Outbox("memory").queue("p1", **PLACE, body={"text": "hi"})


async def _queued():
    return await sync_to_async(queued)()


class AsyncViewTests(TestCase):
    async def test_an_async_view_queues_with_the_a_methods(self):
        response = await self.async_client.post("/async/queue/", {"post_id": "p1", "text": "hello"})

        assert response.status_code == 200
        assert response.json() == {"queued": True, "state": "queued"}

    async def test_the_sync_method_in_an_async_view_raises_synchronous_only_operation(self):
        with self.assertRaises(SynchronousOnlyOperation):
            await self.async_client.post("/async/queue-sync/", {"post_id": "p1"})
        assert await Outbox("memory").afind("p1") is None


class AsyncViewTransactionTests(TransactionTestCase):
    """Real commits and rollbacks: the view's atomic block is the outermost transaction."""

    async def test_a_post_and_its_business_row_commit_together(self):
        response = await self.async_client.post("/async/sign-up/", {"username": "ada"})

        assert response.status_code == 200
        assert await User.objects.filter(username="ada").aexists()
        assert await Outbox("memory").afind("welcome:ada") == PostState("queued", None)

    async def test_a_rolled_back_transaction_queues_nothing(self):
        response = await self.async_client.post("/async/sign-up/", {"username": "bob", "fail": "1"})

        assert response.status_code == 409
        assert response.json() == {"error": "payment refused"}
        assert not await User.objects.filter(username="bob").aexists()
        assert await Outbox("memory").afind("welcome:bob") is None

    def test_a_committed_post_from_an_async_view_is_delivered(self):
        async_to_sync(self.async_client.post)("/async/queue/", {"post_id": "p1", "text": "hello"})

        assert [p.body for p in deliver_due("memory")["memory"]] == [{"text": "hello"}]
