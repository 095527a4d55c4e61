"""The operators' console: see what needs attention, cancel or retry posts; nothing else.

Posts are read-only here. Every change goes through the `Outbox`, which
lock the lane and change a post only with a conditional update on its state, so that a post
a sender holds (`sending`) is never touched from the admin.

A post's state is read with its lane's lease (models.py): a post a sender holds still says
`queued` in its own row. Every post here is read through `PostQuerySet.with_claim` (its
`current_state`, and the claim's attempt, holder, lease end and first send while sending),
and the state filter and header counts through `in_state`.

Built for large tables (a million rows and more): the list never counts a large result
(`EstimatingPaginator`, `show_full_result_count = False`), the header counts are capped and
read the state index (`queued` reads its rows too, to leave out the leased heads), the default
view and the filters follow the model's indexes (the list's order, newest change first, has its
own: connector_outbox_post_updated; each row's lane, for its claim, is one primary-key probe),
and the search looks ids up through indexes before it reads the table.

Every word it shows goes through gettext (the catalogs of locale/): class-level texts lazily,
messages built per request with named placeholders. Ids, reasons and state values in CSS
classes are data, never translated; a state shown as a word is its label, lowercased.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from math import ceil
from typing import TYPE_CHECKING, Any, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR, ChangeList
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.paginator import Page, Paginator
from django.db import connections
from django.db.models import BooleanField, Count, ExpressionWrapper, Q, QuerySet, Window
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from django.utils.timesince import timesince
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _
from rangefilter.filters import DateRangeFilter, DateTimeRangeFilter

from django_connector_outbox.conf import conf
from django_connector_outbox.message import message_of
from django_connector_outbox.message_admin import message_html
from django_connector_outbox.models import Gate, Lane, Post, PostQuerySet, retraction
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import (
    FINISHED_STATES,
    RETRACTABLE_STATES,
    RETRYABLE_STATES,
    Kind,
    Outcome,
    Scope,
    State,
)

# The rows of a post's history shown on its page (a post rate-limited for hours has many).
HISTORY_SHOWN = 50

# Counts stop here: "10,000+" tells an operator as much as an exact figure, and counting a
# million rows on every page load does not scale.
COUNT_CAP = 10_000

# The states the list shows when no state is chosen.

if TYPE_CHECKING:  # ModelAdmin is generic for django-stubs only, not at run time
    PostAdminBase = admin.ModelAdmin[Post]
    GateAdminBase = admin.ModelAdmin[Gate]
else:
    PostAdminBase = GateAdminBase = admin.ModelAdmin

if TYPE_CHECKING:  # Paginator too; _ListFilterChoices (a TypedDict) exists in the stubs only
    from django.contrib.admin.filters import _ListFilterChoices

    PaginatorBase = Paginator[Any]
else:
    PaginatorBase = Paginator


def _when(moment: datetime | None) -> str:
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}" if moment else "—"


def _state_label(state: str) -> str:
    """A state as the list writes it ("queued"), in the operator's language; any other word
    (a skip reason, already translated) as it is."""
    return State(state).label.lower() if state in State.values else state


def _outcome_label(outcome: str) -> str:
    """An attempt's outcome (posts.HISTORY_OUTCOMES) in the operator's language; any other word
    as it is."""
    return str(Outcome(outcome).label) if outcome in Outcome.values else outcome


def _annotation(post: Post, name: str) -> Any:
    """A value its queryset annotated the post with, such as the fields of
    PostQuerySet.with_claim (`current_state`, `lease_until`, ...), which PostAdmin.get_queryset
    reads every post through: the type stubs cannot see them."""
    return getattr(post, name)


def _state(post: Post) -> str:
    """Its real state: `sending` while its lane's lease is on it, though its row says `queued`."""
    return cast(str, _annotation(post, "current_state"))


def with_claim(queryset: QuerySet[Post]) -> PostQuerySet:
    """The posts with their claims (PostQuerySet.with_claim), unless they have them already:
    the actions get the list's queryset, which PostAdmin.get_queryset reads through it."""
    posts = cast(PostQuerySet, queryset)
    return posts if "current_state" in posts.query.annotations else posts.with_claim()


# What PostAdmin._head says of a lane without a head.
NO_HEAD: Mapping[str, Any] = {"pk": None}


def container_heads(lane_ids: Iterable[int], using: str | None) -> dict[int, dict[str, Any]]:
    """The head of each lane (its container), with its real state, by lane id: one query for
    any number of lanes (a page of the list), the heads found through their lanes' rows."""
    heads = Lane.objects.using(using).filter(pk__in=sorted(set(lane_ids))).head_ids()
    # Any: the stubs cannot resolve the values() of with_claim's annotations.
    posts: Any = Post.objects.using(using).filter(pk__in=heads).with_claim()
    return {row["lane_id"]: row for row in posts.values("lane_id", "pk", "post_id", "current_state")}


def parent_pks(posts: Iterable[Post], using: str | None) -> dict[tuple[str, str], int]:
    """The pk of each reply's parent (`thread_of`) by (source, post id): one query, by the unique
    (source, post_id) index, for a page of the list; a pruned parent is missing."""
    wanted = sorted({(post.source, post.thread_of) for post in posts if post.thread_of})
    if not wanted:
        return {}
    match = Q(*(Q(source=source, post_id=post_id) for source, post_id in wanted), _connector=Q.OR)
    rows = Post.objects.using(using).filter(match).values_list("source", "post_id", "pk")
    return {(source, post_id): pk for source, post_id, pk in rows}


def capped_count(queryset: QuerySet[Any], cap: int) -> int:
    """How many rows, counting no further than cap + 1: SELECT COUNT(*) FROM (... LIMIT cap + 1).

    Of their primary keys only: Django would otherwise select (and compile) the annotations
    of the list's rows in the subquery (PostQuerySet.with_claim's), though none is counted.
    """
    return queryset.order_by().values("pk")[: cap + 1].count()


def estimated_count(queryset: QuerySet[Any]) -> int | None:
    """PostgreSQL's estimate of how many rows the queryset returns (its plan's row count).

    A millisecond whatever the table holds: EXPLAIN plans the query without running it, from
    the table's size and statistics. None on other databases (they count exactly, capped).
    """
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    sql, params = queryset.order_by().values("pk").query.get_compiler(using=queryset.db).as_sql()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):  # psycopg 2 returns the text, psycopg 3 the parsed JSON
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


class EstimatingPaginator(PaginatorBase):
    """A paginator that never counts a large result.

    Over COUNT_CAP rows it shows PostgreSQL's estimate ("about 1,000,000 posts"); elsewhere
    it counts at most COUNT_CAP + 1 rows ("more than 10,000"). Either way the pages go up to
    the cap: OFFSET reads every row it skips, and a filter narrows a list faster than paging.

    Under the cap on PostgreSQL, a search gets the page and the exact count in one query
    (COUNT(*) OVER ()): a term that no index serves (a thread id, say) then reads the table
    once rather than twice, once to count and once for the page. Not a filter: there the
    planner reads the newest-first index backwards to fill the page early, but the window
    needs every match, so it walks the whole index (200 ms at a million posts, against 20 ms
    for a capped count through the state index and a page that stops at its 50th row).
    """

    cap = COUNT_CAP

    def __init__(self, *args: Any, number: int = 1, search: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.number = number  # the page the request asks for, fetched with the count
        self.search = search  # a search term narrows the list: page and count in one query
        self.estimated = False
        self.rows: list[Any] | None = None

    @cached_property
    def count(self) -> int:
        # The stubs allow any sliceable sequence; the admin always paginates a queryset.
        queryset = cast(QuerySet[Any], self.object_list)
        estimate = estimated_count(queryset)
        if estimate is not None and estimate > self.cap:
            self.estimated = True
            return estimate
        if estimate is not None and self.search:
            bottom = (self.number - 1) * self.per_page
            counted = queryset.annotate(outbox_total=Window(Count("pk")))
            rows = list(counted[bottom : bottom + self.per_page])
            if rows or self.number == 1:
                self.rows = rows
                return rows[0].outbox_total if rows else 0
        return capped_count(queryset, self.cap)

    @property
    def capped(self) -> bool:
        return not self.estimated and self.count > self.cap

    @cached_property
    def num_pages(self) -> int:
        return min(super().num_pages, ceil((self.cap + 1) / self.per_page))

    @property
    def cap_display(self) -> str:
        return f"{self.cap:,}"

    @property
    def count_display(self) -> str:
        # An estimate to two significant figures: "about 1,000,000", not "about 1,000,017".
        places = len(str(self.count)) - 2
        return f"{round(self.count, -places) if self.estimated and places > 0 else self.count:,}"

    def page(self, number: int | str) -> Page[Any]:
        number = self.validate_number(number)
        if number == self.number and self.rows is not None:
            return Page(self.rows, number, self)
        return super().page(number)


class PostChangeList(ChangeList):
    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Post]:
        # Bodies can be large (up to MAX_BODY_BYTES each) and the list never shows them.
        qs: QuerySet[Post] = super().get_queryset(request, exclude_parameters)
        return qs.defer("body")

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        paginator = cast(EstimatingPaginator, self.paginator)
        if not self.multi_page and paginator.rows is not None:
            # One page in all: the paginator has it already (Django would query it again).
            self.result_list = paginator.rows
        # The heads of the page's waiting containers in one query, rather than a second join
        # in the list query: joined, the planner carries the head's columns through its sort.
        # (The list query joins each post's own lane only, for its claim: with_claim.)
        self.result_list = list(self.result_list)
        waiting = [post for post in self.result_list if _state(post) == State.QUEUED]
        heads = container_heads([post.lane_id for post in waiting], self.queryset.db) if waiting else {}
        # The holds in force over the page's places, in one query too (PostAdmin.due reads them).
        holds = PlaceHolds.over(waiting, self.queryset.db)
        # The replies' parents too, to link to (PostAdmin.thread_of_).
        parents = parent_pks(self.result_list, self.queryset.db)
        for post in self.result_list:
            post.lane_head = heads.get(post.lane_id, NO_HEAD)
            post.place_holds = holds
            post.parent_pk = parents.get((post.source, post.thread_of or ""))


class StateFilter(admin.SimpleListFilter):
    """Without a choice: the states that need an operator's eye. A choice shows any state,
    `sending` and `queued` read with the lanes' leases (PostQuerySet.in_state)."""

    title = _("state")
    parameter_name = "state"
    ALL = "all"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state.value, str(state.label)) for state in State] + [(self.ALL, gettext("All states"))]

    def choices(self, changelist: Any) -> Iterator[_ListFilterChoices]:
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": gettext("Needs attention"),
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == str(lookup),
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        posts = cast(PostQuerySet, queryset)
        if value is None:
            # queued, sending, failed, uncertain: the stored states, since a post that is
            # sending says `queued` in its row; one range of the index (state, updated_at).
            return posts.needing_attention()
        if value == self.ALL:
            return posts
        return posts.in_state(value)


class SourceFilter(admin.SimpleListFilter):
    """The configured sources: listing them costs no query (a DISTINCT would scan the table)."""

    title = _("source")
    parameter_name = "source"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(conf.CONNECTORS)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(source=value) if value is not None else queryset


class OutboxHealth:
    """The header above the list; computed only when the template reads it."""

    cap = COUNT_CAP

    def __init__(self, request: HttpRequest, using: str) -> None:
        self.request = request
        self.using = using
        self.now = timezone.now()

    def _posts(self) -> PostQuerySet:
        return Post.objects.using(self.using).all()

    @cached_property
    def states(self) -> list[dict[str, Any]]:
        # One capped count per state, each a range of the index (state, updated_at): a few
        # milliseconds whatever the table holds, where a GROUP BY reads every row. `sending`
        # and `queued` are told apart by the lanes' leases (one per container at most).
        url = reverse("admin:django_connector_outbox_post_changelist")
        rows = []
        for state in State:
            count = capped_count(self._posts().in_state(state), self.cap)
            rows.append(
                {
                    "state": state.value,
                    "label": state.label,
                    "count": f"{self.cap:,}+" if count > self.cap else f"{count:,}",
                    "alert": count > 0 and state in (State.FAILED, State.UNCERTAIN),
                    "url": f"{url}?state={state.value}",
                }
            )
        return rows

    @cached_property
    def sources(self) -> list[dict[str, Any]]:
        # The oldest due post per source, as the sender's summary line reads it: the index
        # (source, state, queued_at) gives queued posts oldest first; the first due ends the scan.
        rows = []
        for source in sorted(conf.CONNECTORS):
            oldest = (
                self._posts()
                .filter(source=source)
                .oldest_due(self.now)
                .values("pk", "post_id", "queued_at")
                .first()
            )
            rows.append(
                {
                    "source": source,
                    "post_id": oldest["post_id"] if oldest else None,
                    "url": reverse("admin:django_connector_outbox_post_change", args=[oldest["pk"]])
                    if oldest
                    else None,
                    "age": timesince(oldest["queued_at"], self.now) if oldest else None,
                    "since": _when(oldest["queued_at"]) if oldest else None,
                }
            )
        return rows


@admin.register(Post)
class PostAdmin(PostAdminBase):
    list_display = (
        "post_id", "source", "kind", "state_badge", "place", "attempts_", "due", "latest_error", "updated",
    )  # fmt: skip
    list_display_links = ("post_id",)
    list_filter = (
        StateFilter,
        SourceFilter,
        "kind",
        ("queued_at", DateRangeFilter),
        ("updated_at", DateTimeRangeFilter),
    )
    # Exact matches only (see get_search_results); the names feed the search box's label.
    search_fields = ("post_id", "container_id", "thread_id", "message_ref")
    search_help_text = _("Exact post id, container id, thread id or message ref.")
    # The newest changes first: (state, updated_at) serves it per state, and
    # connector_outbox_post_updated (updated_at, id) for all states, pk being Django's tie-breaker.
    ordering = ("-updated_at",)
    sortable_by = ("post_id", "source", "kind", "state_badge", "attempts_", "due", "updated")
    list_select_related = False  # see PostChangeList.get_results (with_claim joins the lane itself)
    list_per_page = 50
    paginator = EstimatingPaginator
    show_full_result_count = False
    # Facet counts would count the table once per filter choice.
    show_facets = admin.ShowFacets.NEVER
    actions = ("cancel_posts", "retract_posts", "retry_posts", "delete_selected")
    fieldsets = (
        (None, {"fields": ("post_id", "source", "kind", "state_badge", "rev", "turn_key")}),
        (
            _("Place"),
            {"fields": ("workspace_id", "container_id", "thread_id", "thread_of_", "queue_position")},
        ),
        (
            _("Delivery"),
            {"fields": ("attempts_", "due", "error", "message_ref", "holder", "lease_until_", "sent_at_")},
        ),
        (_("Attempt history"), {"fields": ("history_",)}),
        (_("Times"), {"fields": ("queued_at_", "next_at_", "created_at_", "updated_at_")}),
        (_("Body"), {"fields": ("pretty_body",)}),
    )
    readonly_fields = (
        "post_id", "source", "kind", "state_badge", "rev", "turn_key", "workspace_id", "container_id",
        "thread_id", "thread_of_", "queue_position", "attempts_", "due", "error", "message_ref", "holder", "lease_until_",
        "sent_at_", "history_", "queued_at_", "next_at_", "created_at_", "updated_at_", "pretty_body",
    )  # fmt: skip
    empty_value_display = "—"

    # -- permissions: read-only; explicit actions only ------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Post | None = None) -> bool:
        # Viewing needs the view permission; nothing here is editable by anyone.
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Post | None = None) -> bool:
        # Only finished posts: a queued or sending post is its container's queue.
        if obj is not None and obj.state not in FINISHED_STATES:
            return False
        return super().has_delete_permission(request, obj)

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.cancel_post")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.retry_post")

    # -- the list -------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Post]:
        # Each post with its lane's claim (the list, the detail page and the actions alike):
        # a post that is sending says `queued` in its own row. One join on the lane's primary
        # key per row; the list query stays one query per page.
        return cast(PostQuerySet, super().get_queryset(request)).with_claim()

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return PostChangeList

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator[Any]:
        # The page asked for, so that the paginator can fetch it with the count (ChangeList
        # turns a malformed number into page 1 the same way).
        try:
            number = max(1, int(request.GET.get(PAGE_VAR, 1)))
        except ValueError:
            number = 1
        search = bool(request.GET.get(SEARCH_VAR, "").strip())
        return EstimatingPaginator(
            queryset, per_page, orphans, allow_empty_first_page, number=number, search=search
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Post], search_term: str
    ) -> tuple[QuerySet[Post], bool]:
        """Posts whose post id, container id, thread id or message ref is the term, exactly.

        Ids are exact strings (Slack's are case-sensitive); a substring search would read every
        row of a large table. Post ids (with the configured sources: the unique index starts
        with the source) and containers (through their lanes) are index lookups; thread ids
        and message refs have no index (each would cost every write of the sender), so they are
        looked up, with post ids of any source, only when the term is neither a post id nor a
        container in the list: that lookup reads the table.
        """
        term = search_term.strip()
        if not term:
            return queryset, False
        lanes = list(Lane.objects.using(queryset.db).filter(container_id=term).values_list("pk", flat=True))
        indexed = queryset.filter(Q(source__in=sorted(conf.CONNECTORS), post_id=term) | Q(lane_id__in=lanes))
        if indexed.exists():
            return indexed, False
        return queryset.filter(Q(post_id=term) | Q(thread_id=term) | Q(message_ref=term)), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # The database only: the queryset without with_claim, whose annotations cost a few
        # milliseconds to build.
        context = {"outbox_health": OutboxHealth(request, super().get_queryset(request).db)}
        return super().changelist_view(request, {**context, **(extra_context or {})})

    @admin.display(description=_("state"), ordering="current_state")
    def state_badge(self, post: Post) -> str:
        state = _state(post)
        return format_html('<span class="outbox-state outbox-state-{}">{}</span>', state, _state_label(state))

    @admin.display(description=_("attempts"), ordering="current_attempts")
    def attempts_(self, post: Post) -> int:
        """The attempts made: while sending, the claim's (counting this one, as
        ClaimedPost.attempts); once posted, the attempt that delivered it (its row's `attempts`
        went back to 0 then: a post delivered on its first try shows 1); otherwise the tries
        its row counts (a held attempt is not counted)."""
        if _state(post) == State.POSTED:
            return post.delivered_attempt
        return cast(int, _annotation(post, "current_attempts"))

    @admin.display(description=_("place"))
    def place(self, post: Post) -> str:
        if post.thread_id:
            where = format_html("{} / {} › {}", post.workspace_id, post.container_id, post.thread_id)
        else:
            where = format_html("{} / {}", post.workspace_id, post.container_id)
        if post.thread_of:
            return format_html("{}<br>{}", where, self.thread_of_(post))
        return where

    @admin.display(description=_("reply to"))
    def thread_of_(self, post: Post) -> str:
        """The post whose thread it goes into (`thread_of`), linked to its page: its thread_id
        is resolved from it when it is sent. For a retract's delete, the post it deletes."""
        if not post.thread_of:
            return self.get_empty_value_display()
        # On a page of the list, found for all at once (PostChangeList); else here.
        missing = object()
        parent = getattr(post, "parent_pk", missing)
        if parent is missing:
            parent = parent_pks([post], post._state.db).get((post.source, post.thread_of))
        deletes = post.kind == Kind.DELETE
        if parent is None:
            pruned = (
                gettext("delete of {post_id} (pruned)") if deletes else gettext("reply to {post_id} (pruned)")
            )
            return format_html(pruned, post_id=post.thread_of)
        url = reverse("admin:django_connector_outbox_post_change", args=[parent])
        linked = (
            gettext('delete of <a href="{url}">{post_id}</a>')
            if deletes
            else gettext('reply to <a href="{url}">{post_id}</a>')
        )
        return format_html(linked, url=url, post_id=post.thread_of)

    @admin.display(description=_("due / held until"), ordering="next_at")
    def due(self, post: Post) -> str:
        """When it goes out next, or why it waits: a hold, a backoff, the head before it, a lease."""
        now = timezone.now()
        state = _state(post)
        if state == State.QUEUED:
            head = self._head(post)
            if head["pk"] is not None and head["pk"] != post.pk:
                url = reverse("admin:django_connector_outbox_post_change", args=[head["pk"]])
                return format_html(
                    gettext('waits behind <a href="{url}">{post_id}</a> ({state})'),
                    url=url,
                    post_id=head["post_id"],
                    state=_state_label(head["current_state"]),
                )
            if gate := _place_hold(post, now):
                return format_html(
                    gettext("held until {until} with its {scope}: {reason}"),
                    until=_when(gate.held_until),
                    scope=Scope(gate.scope).label.lower() if gate.scope in Scope.values else gate.scope,
                    reason=self._short(gate.hold_reason),
                )
            if post.next_at > now:
                if post.last_error:
                    return format_html(
                        gettext("held until {until}: {reason}"),
                        until=_when(post.next_at),
                        reason=self._short(post.last_error),
                    )
                return format_html(gettext("due at {when}"), when=_when(post.next_at))
            return format_html(gettext("due since {when}"), when=_when(post.next_at))
        if state == State.SENDING:
            holder = _annotation(post, "worker") or gettext("a sender")
            lease_until = _annotation(post, "lease_until")
            if lease_until and lease_until <= now:
                return format_html(
                    gettext("lease of {holder} ended {when}: to be taken back"),
                    holder=holder,
                    when=_when(lease_until),
                )
            return format_html(
                gettext("sending by {holder} until {when}"), holder=holder, when=_when(lease_until)
            )
        # Not None: the list shows None as its empty value, but a detail page shows "None".
        return self.get_empty_value_display()

    @admin.display(description=_("updated"), ordering="updated_at")
    def updated(self, post: Post) -> str:
        return _when(post.updated_at)

    @admin.display(description=_("latest error"))
    def latest_error(self, post: Post) -> str:
        if not post.last_error:
            return ""
        return format_html('<span title="{}">{}</span>', post.last_error, self._short(post.last_error))

    @staticmethod
    def _head(post: Post) -> Mapping[str, Any]:
        """Its container's head (`pk`, `post_id`, `current_state`; `pk` None without one):
        read for a page of the list at once, or here for a detail page."""
        head: Mapping[str, Any] | None = getattr(post, "lane_head", None)
        if head is None:
            head = container_heads([post.lane_id], post._state.db).get(post.lane_id, NO_HEAD)
        return head

    @staticmethod
    def _short(text: str) -> str:
        return Truncator(" ".join(text.split())).chars(80)

    # -- the detail page ------------------------------------------------------------------

    @admin.display(description=_("queue position"))
    def queue_position(self, post: Post) -> str:
        state = _state(post)
        if state not in (State.QUEUED, State.SENDING):
            return gettext("not in the queue")
        if state == State.SENDING:  # a lease is only ever on its lane's head
            return gettext("head of its container: being sent")
        if self._head(post)["pk"] == post.pk:
            return gettext("head of its container: the next to go")
        return self.due(post)

    # Times to the second, in the current time zone: what an operator compares with logs.
    @admin.display(description=_("queued at (its place in the container)"))
    def queued_at_(self, post: Post) -> str:
        return _when(post.queued_at)

    @admin.display(description=_("next at (due)"))
    def next_at_(self, post: Post) -> str:
        return _when(post.next_at)

    @admin.display(description=_("created at"))
    def created_at_(self, post: Post) -> str:
        return _when(post.created_at)

    @admin.display(description=_("updated at"))
    def updated_at_(self, post: Post) -> str:
        return _when(post.updated_at)

    # The claim is its lane's, and only while it is sending: a finished post keeps no trace
    # of who sent it or when (its lane has moved on to its next head).
    @admin.display(description=_("sent at (first claim of this run)"))
    def sent_at_(self, post: Post) -> str:
        if _state(post) != State.SENDING:
            return self.get_empty_value_display()
        return _when(_annotation(post, "sent_at"))

    @admin.display(description=_("lease until"))
    def lease_until_(self, post: Post) -> str:
        if _state(post) != State.SENDING:
            return self.get_empty_value_display()
        return _when(_annotation(post, "lease_until"))

    @admin.display(description=_("worker"))
    def holder(self, post: Post) -> str:
        if _state(post) != State.SENDING:
            return self.get_empty_value_display()
        return cast(str, _annotation(post, "worker")) or self.get_empty_value_display()

    @admin.display(description=_("latest error"))
    def error(self, post: Post) -> str:
        if not post.last_error:
            return self.get_empty_value_display()
        return format_html('<pre class="outbox-pre">{}</pre>', post.last_error)

    @admin.display(description=_("attempts that did not deliver it"))
    def history_(self, post: Post) -> str:
        """Its history (models.Attempt), the latest first: when, which attempt, what came of
        it, why and which sender; the latest HISTORY_SHOWN rows."""
        rows = list(
            post.history.order_by("-at", "-pk").values_list("at", "attempt", "outcome", "reason", "worker")[
                : HISTORY_SHOWN + 1
            ]
        )
        if not rows:
            return self.get_empty_value_display()
        more = ""
        if len(rows) > HISTORY_SHOWN:
            rows = rows[:HISTORY_SHOWN]
            more = format_html('<p class="outbox-more">{}</p>', self._latest_shown())
        body = format_html_join(
            "",
            '<tr><td class="nowrap">{}</td><td>{}</td><td>{}</td><td><pre class="outbox-pre">{}</pre></td><td>{}</td></tr>',
            (
                (_when(at), attempt, _outcome_label(outcome), reason or self.get_empty_value_display(),
                 worker or self.get_empty_value_display())
                for at, attempt, outcome, reason, worker in rows
            ),
        )  # fmt: skip
        return format_html(
            '<table class="outbox-history"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
            "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>{}",
            gettext("when"),
            gettext("attempt"),
            gettext("outcome"),
            gettext("reason"),
            gettext("worker"),
            body,
            more,
        )

    @staticmethod
    def _latest_shown() -> str:
        return ngettext("the latest %(count)s shown", "the latest %(count)s shown", HISTORY_SHOWN) % {
            "count": HISTORY_SHOWN
        }

    @admin.display(description=_("body"))
    def pretty_body(self, post: Post) -> str:
        if post.body is None:
            return gettext("— (dropped once the post was delivered or cancelled)")
        if (message := message_of(post.body)) is not None:
            return message_html(message, post.source)
        text = json.dumps(post.body, indent=2, ensure_ascii=False, sort_keys=True, default=str)
        return format_html('<pre class="outbox-pre">{}</pre>', text)

    # -- actions --------------------------------------------------------------------------

    def _outbox(self, source: str, using: str) -> Outbox | None:
        try:
            return Outbox(source, using=using)
        except ImproperlyConfigured:
            return None

    @staticmethod
    def _skipped(counts: Counter[str]) -> str:
        order = [state.value for state in State]
        reasons = sorted(counts, key=lambda r: (order.index(r) if r in order else len(order), r))
        return ", ".join(f"{counts[reason]} {_state_label(reason)}" for reason in reasons)

    def _report(self, request: HttpRequest, done: str, why: str, skipped: Counter[str]) -> None:
        if skipped:
            total = sum(skipped.values())
            text = gettext("%(done)s; %(total)s skipped: %(why)s (%(skipped)s)") % {
                "done": done,
                "total": total,
                "why": why,
                "skipped": self._skipped(skipped),
            }
            self.message_user(request, text, messages.WARNING)
        else:
            self.message_user(request, done, messages.SUCCESS)

    @admin.action(permissions=["cancel"], description=_("Cancel selected queued posts"))
    def cancel_posts(self, request: HttpRequest, queryset: QuerySet[Post]) -> None:
        cancelled = 0
        skipped: Counter[str] = Counter()
        for post in with_claim(queryset).defer("body").order_by("pk"):
            # A post a sender holds is `sending` (its lane's lease), though its row says
            # `queued`; cancel_queued refuses it too, should a claim come in meanwhile.
            state = _state(post)
            if state != State.QUEUED:
                skipped[state] += 1
                continue
            outbox = self._outbox(post.source, queryset.db)
            if outbox is None:
                skipped[gettext("of an unconfigured source")] += 1
            elif outbox.cancel_queued(post.post_id):
                cancelled += 1
                self.log_change(request, post, "Cancelled (admin action cancel_posts).")
            else:
                skipped[gettext("no longer queued")] += 1
        done = ngettext("%(count)s cancelled", "%(count)s cancelled", cancelled) % {"count": cancelled}
        self._report(request, done, gettext("only queued posts can be cancelled"), skipped)

    @admin.action(permissions=["cancel"], description=_("Retract selected posted posts"))
    def retract_posts(self, request: HttpRequest, queryset: QuerySet[Post]) -> None:
        """Outbox.retract for the posted (and sending) posts: a delete of each one's message
        queued behind it. The permission and the rules of cancelling (a retract of a post not
        yet seen is a cancel): no confirmation page, the rest skipped with why."""
        retracted = 0
        skipped: Counter[str] = Counter()
        for post in with_claim(queryset).defer("body").order_by("pk"):
            state = _state(post)
            if state not in RETRACTABLE_STATES:
                skipped[state] += 1
                continue
            outbox = self._outbox(post.source, queryset.db)
            if outbox is None:
                skipped[gettext("of an unconfigured source")] += 1
            elif Kind.DELETE not in conf.kinds(post.source):
                skipped[gettext("of a source that cannot delete")] += 1
            elif outbox.retract(post.post_id):
                retracted += 1
                self.log_change(
                    request, post, f"Retracted: its delete queued, from {state} (admin action retract_posts)."
                )
            else:
                skipped[gettext("retracted already, or without a message")] += 1
        done = ngettext("%(count)s retracted", "%(count)s retracted", retracted) % {"count": retracted}
        self._report(request, done, gettext("only posted posts can be retracted"), skipped)

    @admin.action(permissions=["retry"], description=_("Retry selected failed or uncertain posts"))
    def retry_posts(self, request: HttpRequest, queryset: QuerySet[Post]) -> HttpResponse | None:
        return self._retry(request, queryset)

    def _retry(
        self, request: HttpRequest, queryset: QuerySet[Post], back: str | None = None
    ) -> HttpResponse | None:
        """Retry the failed and uncertain posts of `queryset`, uncertain ones once confirmed:
        the confirmation page (whose "No" goes to `back`, or the list) or None once done."""
        posts = list(
            with_claim(queryset)
            .defer("body")
            .annotate(has_body=ExpressionWrapper(Q(body__isnull=False), output_field=BooleanField()))
            .order_by("pk")
        )
        uncertain = [post for post in posts if _state(post) == State.UNCERTAIN]
        if uncertain and request.POST.get("confirm") != "yes":
            return self._confirm_retry(request, posts, uncertain, back)
        retried = 0
        skipped: Counter[str] = Counter()
        for post in posts:
            state = _state(post)
            if state not in RETRYABLE_STATES:
                skipped[state] += 1
                continue
            outbox = self._outbox(post.source, queryset.db)
            if outbox is None:
                skipped[gettext("of an unconfigured source")] += 1
            elif not _annotation(post, "has_body"):
                skipped[gettext("without a body")] += 1
            elif outbox.requeue(post.post_id):
                retried += 1
                note = " It may appear twice: it was uncertain." if state == State.UNCERTAIN else ""
                self.log_change(
                    request,
                    post,
                    f"Retried: back to the queue from {state} (admin action retry_posts).{note}",
                )
            else:
                skipped[gettext("no longer failed or uncertain")] += 1
        done = ngettext("%(count)s retried", "%(count)s retried", retried) % {"count": retried}
        self._report(request, done, gettext("only failed and uncertain posts can be retried"), skipped)
        return None

    def _confirm_retry(
        self, request: HttpRequest, posts: Sequence[Post], uncertain: Sequence[Post], back: str | None
    ) -> TemplateResponse:
        """Ask first: an uncertain post may already be in the source, and would appear twice."""
        failed = sum(1 for post in posts if _state(post) == State.FAILED)
        others: Counter[str] = Counter(_state(post) for post in posts if _state(post) not in RETRYABLE_STATES)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Retry uncertain posts?"),
            "subtitle": None,
            "opts": self.opts,
            "uncertain": uncertain,
            "failed_count": failed,
            "skipped": self._skipped(others) if others else "",
            "selected": [post.pk for post in posts],
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "back_url": back
            or reverse(f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_changelist"),
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request,
            [
                f"admin/{self.opts.app_label}/{self.opts.model_name}/retry_confirmation.html",
                f"admin/{self.opts.app_label}/retry_confirmation.html",
            ],
            context,
        )

    # -- the change page's buttons: the actions, for one post -------------------------------

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/retry/", view(self.retry_view), name=f"{name}_retry"),
            path("<path:object_id>/cancel/", view(self.cancel_view), name=f"{name}_cancel"),
            path("<path:object_id>/retract/", view(self.retract_view), name=f"{name}_retract"),
            *super().get_urls(),
        ]

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Post | None = None,
    ) -> HttpResponse:
        """The retry, cancel and retract buttons, where they apply to the post (retract: a
        posted or sending message of a source that deletes, not retracted yet) and the user
        holds the action's permission."""
        if obj is not None:
            state, name = _state(obj), f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}"
            args = [quote(obj.pk)]
            if state in RETRYABLE_STATES and obj.body is not None and self.has_retry_permission(request):
                context["outbox_retry_url"] = reverse(f"{name}_retry", args=args)
            if state == State.QUEUED and self.has_cancel_permission(request):
                context["outbox_cancel_url"] = reverse(f"{name}_cancel", args=args)
            if self._retractable(obj, state) and self.has_cancel_permission(request):
                context["outbox_retract_url"] = reverse(f"{name}_retract", args=args)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def retry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The retry button: retry_posts for this post (an uncertain one after its confirmation)."""
        return self._button(request, object_id, self.has_retry_permission, self._retry)

    @staticmethod
    def _retractable(post: Post, state: str) -> bool:
        """Whether a retract of this post would delete its message (models.retraction), for
        the button: one read of its delete, on its page only."""
        if state not in RETRACTABLE_STATES or post.source not in conf.CONNECTORS:
            return False
        if Kind.DELETE not in conf.kinds(post.source):
            return False
        if not retraction(post.kind, state, post.message_ref).delete:
            return False
        return (
            not Post.objects.using(post._state.db).filter(source=post.source).deleting(post.post_id).exists()
        )

    def retract_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The retract button: retract_posts for this post."""
        return self._button(
            request, object_id, self.has_cancel_permission, lambda r, q, back: self.retract_posts(r, q)
        )

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The cancel button: cancel_posts for this post."""
        return self._button(
            request, object_id, self.has_cancel_permission, lambda r, q, back: self.cancel_posts(r, q)
        )

    def _button(
        self,
        request: HttpRequest,
        object_id: str,
        allowed: Callable[[HttpRequest], bool],
        action: Callable[[HttpRequest, QuerySet[Post], str], HttpResponse | None],
    ) -> HttpResponse:
        """Run an action on one post, as its bulk action does (permission, messages,
        confirmation), then go back to the post's page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and allowed(request)):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(gettext("no post with the primary key %(pk)r") % {"pk": object_id})
        back = reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_change",
            args=[quote(obj.pk)],
        )
        response = action(request, self.get_queryset(request).filter(pk=obj.pk), back)
        return response if response is not None else HttpResponseRedirect(back)

    @admin.action(permissions=["delete"], description=_("Delete selected finished posts"))
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[Post]) -> HttpResponse | None:
        """Django's delete (with its confirmation page), for the finished posts of the selection."""
        posts: Any = with_claim(queryset)  # Any: values_list of an annotation (see container_heads)
        active: Counter[str] = Counter(posts.active().order_by().values_list("current_state", flat=True))
        finished = posts.finished()
        if active:
            total = sum(active.values())
            self.message_user(
                request,
                gettext("%(total)s skipped: only finished posts can be deleted (%(skipped)s)")
                % {"total": total, "skipped": self._skipped(active)},
                messages.WARNING,
            )
        if not finished.exists():
            return None
        return django_delete_selected(self, request, finished)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Post]) -> None:
        # Conditional on the state in the same statement: a status post may have been queued
        # again since the confirmation page, and a queued post is its container's queue.
        cast(PostQuerySet, queryset).finished().delete()

    def delete_model(self, request: HttpRequest, obj: Post) -> None:
        Post.objects.using(obj._state.db).filter(pk=obj.pk).finished().delete()


class PlaceHolds:
    """The holds in force over the places of some posts (their sources, workspaces, containers),
    read in one query: a page of the list reads them once, not once per row."""

    def __init__(self, gates: Iterable[Gate]) -> None:
        self.gates: dict[str, list[Gate]] = {}
        for gate in gates:
            self.gates.setdefault(gate.source, []).append(gate)

    @classmethod
    def over(cls, posts: Sequence[Post], using: str | None, now: datetime | None = None) -> PlaceHolds:
        """The holds in force at `now` (default: now) over the places of `posts`; no query without posts."""
        if not posts:
            return cls([])
        gates = Gate.objects.using(using).filter(source__in=sorted({post.source for post in posts}))
        reached = gates.reaching((post.workspace_id, post.container_id) for post in posts)
        return cls(reached.holding(now or timezone.now()))

    def of(self, post: Post, now: datetime) -> Gate | None:
        """The latest-ending hold of the post's container, workspace or source in force at `now`."""
        held = [
            gate
            for gate in self.gates.get(post.source, [])
            if gate.reaches(post.workspace_id, post.container_id)
            and gate.held_until
            and gate.held_until > now
        ]
        return max(held, key=lambda gate: gate.held_until or now, default=None)


def _place_hold(post: Post, now: datetime) -> Gate | None:
    """The latest-ending hold of the post's container, workspace or source in force now, if any:
    from the holds of its page of the list, or read for it alone (its detail page)."""
    holds = getattr(post, "place_holds", None)
    if holds is None:
        holds = PlaceHolds.over([post], post._state.db, now)
    return holds.of(post, now)


@admin.register(Gate)
class GateAdmin(GateAdminBase):
    """Held workspaces and sources (a wider 429: until when, and why) and the shared paces."""

    list_display = ("source", "scope", "workspace_id", "container_id", "held", "hold_reason", "pace")
    list_filter = ("source", "scope")
    search_fields = ("workspace_id", "container_id")
    ordering = ("-held_until",)

    @admin.display(description=_("held until"), ordering="held_until")
    def held(self, gate: Gate) -> str:
        if gate.held_until is None or gate.held_until <= timezone.now():
            return "-"
        return _when(gate.held_until)

    @admin.display(description=_("pace tat"))
    def pace(self, gate: Gate) -> str:
        return _when(gate.pace_state) if gate.pace_state else "-"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Gate | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Gate | None = None) -> bool:
        return False


# Installations, destinations and senders have their own modules; importing them registers them.
from django_connector_outbox import senders_admin  # noqa: E402, F401
from django_connector_outbox.installations import admin as installations_admin  # noqa: E402, F401
