"""The frontend side of toolmesh: connect, open sessions, submit calls, await their answers."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import ssl
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, cast

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from ._wire import (
    DEFAULT_CALL_TIMEOUT,
    DEFAULT_DEADLINE_GRACE,
    DEFAULT_PREFIX,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_TENANT,
    JS_ERR_MESSAGE_TOO_LARGE,
    JS_ERR_STREAM_FULL,
    MAX_ARGUMENT_DEPTH,
    CallRequest,
    CancelReply,
    CancelRequest,
    Catalog,
    CatalogEntry,
    CatalogNames,
    CatalogRequest,
    Described,
    Expanded,
    Groups,
    GroupState,
    ProgressEvent,
    Rejection,
    Resolved,
    SchemaEvent,
    ToolCall,
    ToolMessage,
    ToolSchema,
)
from .errors import (
    CallCancelledError,
    DeadlineExceededError,
    InternalError,
    InvalidArgumentsError,
    InvalidRequestError,
    OverloadedError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ToolmeshError,
    UnauthorizedError,
    UnavailableError,
)
from .formats import NameMap, from_openai_tool_calls
from .subjects import Subjects

_log = logging.getLogger("toolmesh")

__all__ = [
    "CallHandle",
    "Mesh",
    "Session",
    "SessionEvent",
    "connect",
]

# What nats-py reports of a subscription the server refused: its subject.
_SUBSCRIPTION_DENIED = re.compile(r'permissions violation for subscription to "([^"]+)"', re.I)
# How many finished call ids a session remembers (a digest of each final message) to drop repeats.
_FINISHED_REMEMBERED = 4096
# Rejections kept while their submission's PubAck is on its way.
_EARLY_REJECTIONS_REMEMBERED = 256
# After a reconnect, waiting calls read their stored answers at once and again after these
# delays (seconds): on a cluster, an answer published on another server before the new
# subscription reached it goes to nobody live, and the replica that answers a direct get may not
# hold it yet.
_CATCH_UP_AGAIN = (1.0, 5.0)
# A read that failed (no stream leader yet, a timeout) is tried again after this, doubling.
_LOOKUP_RETRY_FIRST, _LOOKUP_RETRY_MAX = 0.25, 2.0
_STREAM_FULL_CODES = frozenset({JS_ERR_STREAM_FULL, 10047, 10028})


@dataclass(frozen=True)
class SessionEvent:
    """Something that happened on a session.

    ``type`` is ``result`` (``body`` a ToolMessage), ``progress`` (a ProgressEvent),
    ``rejected`` (a Rejection: a submission refused without touching the call its key names),
    ``schema`` (a SchemaEvent; ``tool`` names the tool) or ``approval`` (an
    ApprovalRequiredEvent: the call was accepted and waits for a person; with ``mode:
    "caller"``, for :meth:`Session.confirm`).
    """

    type: Literal["result", "progress", "rejected", "schema", "approval"]
    body: Mapping[str, Any]
    tool: str = ""


async def connect(
    servers: str | Sequence[str] | None = None,
    *,
    tenant: str | None = None,
    prefix: str | None = None,
    user: str | None = None,
    password: str | None = None,
    token: str | None = None,
    nkey_seed: str | None = None,
    creds: str | None = None,
    tls: ssl.SSLContext | None = None,
    tls_ca: str | None = None,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    inbox_prefix: str | None = None,
    default_timeout: float = DEFAULT_CALL_TIMEOUT,
    deadline_grace: float = DEFAULT_DEADLINE_GRACE,
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    name: str = "toolmesh-python",
    reconnect_time_wait: float | None = None,
    nats_options: Mapping[str, Any] | None = None,
) -> Mesh:
    """Connects a frontend of ``tenant`` to the mesh and returns its :class:`Mesh`.

    Credentials are the NATS ones of the tenant's account: ``user``/``password``, ``token``,
    ``nkey_seed`` (a seed file's path), ``creds`` (a credentials file's path) and TLS (an
    ``ssl.SSLContext``, or ``tls_ca``/``tls_cert``/``tls_key`` PEM paths). Whatever is not given
    comes from the environment the mesh's own processes read: ``NATS_URL`` (comma-separated;
    default ``nats://127.0.0.1:4222``), ``NATS_USER``, ``NATS_PASSWORD``, ``NATS_TOKEN``,
    ``NATS_NKEY``, ``NATS_CREDS``, ``NATS_CA``, ``NATS_CERT``, ``NATS_KEY``, ``TOOLMESH_TENANT``
    (default ``default``) and ``TOOLMESH_PREFIX`` (default ``toolmesh``). Replies come below the
    frontend inbox prefix ``_INBOX.{p}.frontend.{t}`` unless ``inbox_prefix`` says otherwise
    (``….{t}.{s}`` for a user confined to one session). Durations are in seconds;
    ``reconnect_time_wait`` is the pause between reconnect attempts (nats-py's default, 2 s).
    ``nats_options`` go to ``nats.connect`` as they are. The connection reconnects for ever;
    after each reconnect the answers of waiting calls are read from the sessions stream.

    Raises :class:`UnauthorizedError` (not retryable) when the server refuses the credentials,
    :class:`UnavailableError` when no server can be reached.
    """
    env = _Environment()
    servers = env.servers() if servers is None else servers
    tenant = tenant if tenant is not None else env.get("TOOLMESH_TENANT") or DEFAULT_TENANT
    prefix = prefix if prefix is not None else env.get("TOOLMESH_PREFIX") or DEFAULT_PREFIX
    user = user if user is not None else env.get("NATS_USER")
    password = password if password is not None else env.get("NATS_PASSWORD")
    token = token if token is not None else env.get("NATS_TOKEN")
    nkey_seed = nkey_seed if nkey_seed is not None else env.get("NATS_NKEY")
    creds = creds if creds is not None else env.get("NATS_CREDS")
    if tls is None:
        tls_ca = tls_ca if tls_ca is not None else env.get("NATS_CA")
        tls_cert = tls_cert if tls_cert is not None else env.get("NATS_CERT")
        tls_key = tls_key if tls_key is not None else env.get("NATS_KEY")
    subjects = Subjects(prefix=prefix, tenant=tenant)
    if tls is None and (tls_ca or tls_cert):
        tls = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=tls_ca)
        if tls_cert:
            tls.load_cert_chain(tls_cert, tls_key)
    holder: list[Mesh] = []

    async def reconnected() -> None:
        if holder:
            holder[0]._reconnected()

    last_error: list[Exception] = []

    async def report(err: Exception) -> None:
        # One line, not nats-py's traceback per failed attempt.
        if len(last_error) < 16:  # the connect attempts' errors; later ones are only logged
            last_error.append(err)
        _log.warning("toolmesh: NATS: %s", err or type(err).__name__)
        if holder:
            holder[0]._nats_error(err)

    options: dict[str, Any] = {
        "servers": [servers] if isinstance(servers, str) else list(servers),
        "name": name,
        "inbox_prefix": inbox_prefix or subjects.inbox_prefix,
        # Two tries per server to connect at all; once connected, reconnect for ever.
        "max_reconnect_attempts": 1,
        "reconnected_cb": reconnected,
        "error_cb": report,
        **({"user": user} if user is not None else {}),
        **({"password": password} if password is not None else {}),
        **({"token": token} if token is not None else {}),
        **({"nkeys_seed": nkey_seed} if nkey_seed is not None else {}),
        **({"user_credentials": creds} if creds is not None else {}),
        **({"tls": tls} if tls is not None else {}),
        **({"reconnect_time_wait": reconnect_time_wait} if reconnect_time_wait else {}),
        **(nats_options or {}),
    }
    try:
        nc = await nats.connect(**options)
    except (TimeoutError, OSError, nats.errors.Error) as err:
        servers_text = ", ".join(options["servers"])
        refused = _is_refused_credentials([*last_error, err])
        causes = [e for e in last_error if _is_refused_credentials([e])] if refused else last_error
        cause = causes[-1] if causes else err
        reason = str(cause) or type(cause).__name__
        if refused:
            # Trying again with the same credentials cannot succeed.
            raise UnauthorizedError(
                f"NATS at {servers_text} refused the credentials: {reason}",
                details={"servers": options["servers"]},
            ) from err
        raise UnavailableError(f"cannot connect to NATS at {servers_text}: {reason}") from err
    nc.options["max_reconnect_attempts"] = (nats_options or {}).get("max_reconnect_attempts", -1)
    mesh = Mesh(
        nc,
        subjects,
        default_timeout=default_timeout,
        deadline_grace=deadline_grace,
        request_timeout=request_timeout,
        owns_connection=True,
    )
    holder.append(mesh)
    return mesh


class Mesh:
    """A tenant's connection to the mesh: open a :class:`Session` per conversation."""

    def __init__(
        self,
        nc: NatsClient,
        subjects: Subjects,
        *,
        default_timeout: float = DEFAULT_CALL_TIMEOUT,
        deadline_grace: float = DEFAULT_DEADLINE_GRACE,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        owns_connection: bool = False,
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = subjects
        self.tenant = subjects.tenant
        self.default_timeout = default_timeout
        self.deadline_grace = deadline_grace
        self.request_timeout = request_timeout
        self._owns_connection = owns_connection
        self._sessions: set[Session] = set()

    async def __aenter__(self) -> Mesh:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _nats_error(self, err: Exception) -> None:
        """An error the server reported on the connection: a refused subscription to a session's
        events (a user of another tenant, or confined to other sessions) fails that session's
        calls at once, since nothing would ever answer them."""
        found = _SUBSCRIPTION_DENIED.search(str(err))
        if found is None:
            return
        subject = found.group(1)
        for session in list(self._sessions):
            if session._events_subject == subject:
                session._events_denied(
                    PermissionDeniedError(
                        f"NATS denied this connection the events on {subject}: its user may "
                        f"not act for tenant {self.tenant} or this session (check the client's "
                        "tenant and the user's credentials)",
                        retryable=False,
                        details={"subject": subject, "tenant": self.tenant},
                    )
                )

    def session(self, session_id: str, *, agent: str | None = None) -> Session:
        """Opens a session; ``agent`` is the agent its calls and catalog requests name."""
        session = Session(self, session_id, agent=agent)
        self._sessions.add(session)
        return session

    async def close(self) -> None:
        """Closes every session (waiting calls settle ``cancelled``) and drains the connection."""
        for session in list(self._sessions):
            await session.close()
        if self._owns_connection and not self.nc.is_closed:
            with contextlib.suppress(nats.errors.Error, OSError):
                await self.nc.drain()

    async def resolve(
        self,
        session_id: str,
        name: str,
        arguments: str | Mapping[str, Any] | None = None,
        *,
        call_id: str | None = None,
        timeout: float | None = None,
        attempt_timeout: float | None = None,
        idempotency_key: str | None = None,
        context: Mapping[str, Any] | None = None,
        agent_context: Mapping[str, Any] | None = None,
        agent: str | None = None,
        edge_params: Sequence[str] | None = None,
    ) -> Resolved:
        """Dry run: ``{"ok": True, "resolved": …}`` with the call as it would be routed under
        ``resolved`` (defaults filled, ``input_parameters``), or the typed error it would get,
        raised. Nothing runs. Options are those of ``submit``."""
        request = _build_request(
            session_id,
            name,
            arguments,
            call_id=call_id,
            timeout=timeout,
            attempt_timeout=attempt_timeout,
            idempotency_key=idempotency_key,
            context=context,
            agent_context=agent_context,
            agent=agent,
            edge_params=edge_params,
        )
        problem = _local_problem(request)
        if problem is not None:
            raise problem
        _as_json_text(request)
        reply = await self._request(self.subjects.rpc("resolve"), request, "resolver")
        return cast(Resolved, _ok_or_raise(reply))

    async def catalog(self, *, agent: str | None = None, names: CatalogNames = "mesh") -> Catalog:
        """The tenant's compact catalog (every tool, or an agent's), filtered by its groups.
        ``names="provider_safe"``: each entry's ``name`` is its provider-safe name and ``tool``
        the mesh name to call."""
        body: CatalogRequest = {} if agent is None else {"agent": agent}
        if names != "mesh":
            body["names"] = names
        return await self._catalog(body)

    async def groups(self) -> list[GroupState]:
        """Every tool group and whether it is active for the tenant's sessions."""
        return await self.set_groups()

    async def set_groups(
        self,
        *,
        enable: Sequence[str] = (),
        disable: Sequence[str] = (),
        reset: Sequence[str] = (),
    ) -> list[GroupState]:
        """Switches groups for every session of the tenant; returns every group afterwards."""
        body = _group_changes(enable, disable, reset)
        return cast(Groups, await self._schema_request("groups", body))["groups"]

    async def _catalog(self, body: CatalogRequest) -> Catalog:
        """The whole catalog, page by page: a large one comes in pages, each naming the
        ``next_cursor`` of the next; a tool on two pages is kept once."""
        first = await self._schema_request("catalog", body)
        tools = list(first["tools"])
        seen = {tool["name"] for tool in tools}
        page = first
        while page.get("next_cursor") is not None:
            page = await self._schema_request("catalog", {**body, "cursor": page["next_cursor"]})
            for tool in page["tools"]:
                if tool["name"] not in seen:
                    seen.add(tool["name"])
                    tools.append(tool)
        whole = {key: value for key, value in first.items() if key != "next_cursor"}
        return cast(Catalog, {**whole, "tools": tools})

    async def _schema_request(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        reply = await self._request(self.subjects.rpc(kind), body, "schema expander")
        return _ok_or_raise(reply)

    async def _request(self, subject: str, body: Any, service: str) -> dict[str, Any]:
        """A core request-reply; failures are typed as the TypeScript client types them."""
        try:
            msg = await self.nc.request(subject, _encode(body), timeout=self.request_timeout)
        except nats.errors.NoRespondersError as err:
            raise UnavailableError(f"no {service} is running") from err
        except nats.errors.TimeoutError as err:
            raise UnavailableError(
                f"the {service} did not answer within {self.request_timeout:g} s"
            ) from err
        except (nats.errors.Error, OSError) as err:
            raise UnavailableError(f"request to the {service} failed: {err}") from err
        try:
            reply = json.loads(msg.data)
        except ValueError as err:
            raise InternalError(f"the {service} sent a reply that is not JSON") from err
        if not isinstance(reply, dict):
            raise InternalError(f"the {service} sent a reply of another shape")
        return reply

    async def _last_stored(self, subject: str) -> dict[str, Any] | None:
        """The last message stored on a session subject, by direct get (None: none stored).
        Raises :class:`UnavailableError` when the read fails: that is no "not there"."""
        try:
            msg = await self.nc.request(
                self.subjects.direct_get(subject), b"", timeout=self.request_timeout
            )
        except (TimeoutError, nats.errors.Error, OSError) as err:
            raise UnavailableError(f"cannot read the sessions stream: {err!r}") from err
        status = (msg.headers or {}).get("Status")
        if status == "404":
            return None
        if status is not None:
            description = (msg.headers or {}).get("Description", "")
            raise UnavailableError(f"cannot read the sessions stream: {status} {description}")
        if not msg.data:
            return None
        body = json.loads(msg.data)
        return body if isinstance(body, dict) else None

    def _reconnected(self) -> None:
        for session in list(self._sessions):
            session.catch_up()

    def _forget(self, session: Session) -> None:
        self._sessions.discard(session)


@dataclass
class _Pending:
    call_id: str
    tool: str
    args_hash: str
    future: asyncio.Future[ToolMessage]
    timer: asyncio.TimerHandle | None = None
    progress: list[ProgressEvent] = field(default_factory=list)
    wakers: list[asyncio.Future[None]] = field(default_factory=list)
    task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        for waker in self.wakers:
            if not waker.done():
                waker.set_result(None)
        self.wakers.clear()


class CallHandle:
    """One submitted call: its final message, its progress, and a way to cancel it."""

    def __init__(self, session: Session, pending: _Pending, idempotency_key: str | None) -> None:
        self._session = session
        self._pending = pending
        self._key = idempotency_key
        self.call_id = pending.call_id
        self.tool = pending.tool

    async def message(self) -> ToolMessage:
        """The one final message — a result or a typed error as a tool message. Never raises:
        ready to hand to the model."""
        return await asyncio.shield(self._pending.future)

    async def result(self) -> ToolMessage:
        """The final message of a successful call; a failed call raises its typed error."""
        message = await self.message()
        error = message.get("error")
        if error is not None:
            raise ToolmeshError.from_wire(error)
        return message

    async def progress(self) -> AsyncIterator[ProgressEvent]:
        """Every progress event of the call, from its start, until the call settles."""
        pending = self._pending
        index = 0
        while True:
            if index < len(pending.progress):
                index += 1
                yield pending.progress[index - 1]
                continue
            if pending.future.done():
                return
            waker: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            pending.wakers.append(waker)
            await waker

    async def cancel(self) -> CancelReply:
        """Asks the mesh to cancel the call (a queued call never starts, a running one is
        aborted); the call then settles with ``cancelled``, unless it had already ended."""
        return await self._session.cancel(self.call_id, idempotency_key=self._key)

    def __await__(self) -> Generator[Any, None, ToolMessage]:
        """``await handle`` is ``await handle.result()``."""
        return self.result().__await__()


class Session:
    """A conversation's view of the mesh: submit calls, await their answers, watch its events."""

    def __init__(self, mesh: Mesh, session_id: str, *, agent: str | None = None) -> None:
        self.mesh = mesh
        self.id = session_id
        self.agent = agent
        self._subjects = mesh.subjects
        self._sub: Subscription | None = None
        self._subscribing = asyncio.Lock()
        self._pending: dict[str, _Pending] = {}
        self._finished: OrderedDict[str, str] = OrderedDict()
        self._seq_of: dict[str, int] = {}
        self._call_at: dict[int, str] = {}
        self._early_rejections: OrderedDict[int, Rejection] = OrderedDict()
        self._listeners: set[asyncio.Queue[SessionEvent | None]] = set()
        self._schemas: dict[str, ToolSchema] = {}
        self._pending_schemas: dict[str, dict[str, Any]] = {}
        self._schema_waiters: list[tuple[str, asyncio.Future[None]]] = []
        # Cancel requests of calls whose awaiting task was cancelled, by call id.
        self._cancelling: dict[str, asyncio.Task[CancelReply]] = {}
        # Reads of stored answers under way, by call id, and the later passes of a catch-up.
        self._looking_up: dict[str, asyncio.Task[None]] = {}
        self._catch_up_timers: set[asyncio.TimerHandle] = set()
        self._closed = False
        # Set when NATS refused this connection the session's events (_events_denied).
        self._denied: ToolmeshError | None = None
        # The sessions subject is built now, so a bad session id fails here.
        self._events_subject = self._subjects.session_events(session_id)

    async def __aenter__(self) -> Session:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def open(self) -> None:
        """Subscribes to the session's subjects (done by the first submit or events() too)."""
        if self._closed:
            raise InvalidRequestError("session is closed")
        async with self._subscribing:
            if self._sub is None:
                self._sub = await self.mesh.nc.subscribe(self._events_subject, cb=self._on_message)

    # ---- calls ----

    async def submit(
        self,
        name: str | ToolCall | Mapping[str, Any],
        arguments: str | Mapping[str, Any] | None = None,
        *,
        call_id: str | None = None,
        timeout: float | None = None,
        attempt_timeout: float | None = None,
        idempotency_key: str | None = None,
        context: Mapping[str, Any] | None = None,
        agent_context: Mapping[str, Any] | None = None,
        agent: str | None = None,
        edge_params: Sequence[str] | None = None,
    ) -> CallHandle:
        """Submits one call and returns its handle once it is on its way.

        ``name`` is a tool name (with ``arguments`` as an object or JSON text), or an OpenAI
        ``tool_calls`` entry. ``call_id`` defaults to the entry's id or a fresh one; submit the
        same call again under the same call id (or ``idempotency_key``) and it runs once.
        ``timeout`` is the call's whole budget in seconds. The handle's ``result()`` settles with
        the call's final message, or a local ``deadline_exceeded`` when nothing arrives by the
        deadline plus the grace period.
        """
        await self.open()
        if isinstance(name, str):
            tool, args = name, arguments
        else:
            function = name["function"]
            tool, args = function["name"], function.get("arguments", arguments)
            call_id = call_id or name.get("id")
        budget = self.mesh.default_timeout if timeout is None else timeout
        request = _build_request(
            self.id,
            tool,
            args,
            call_id=call_id,
            timeout=budget,
            attempt_timeout=attempt_timeout,
            idempotency_key=idempotency_key,
            context=context,
            agent_context=agent_context,
            agent=agent or self.agent,
            edge_params=edge_params,
        )
        cid = request["tool_call"]["id"]
        cancelling = self._cancelling.get(cid)
        if cancelling is not None:
            # The mesh hears of the cancel before it hears of the call again.
            await asyncio.shield(cancelling)
        problem = _local_problem(request) or self._denied
        if problem is None:
            _as_json_text(request)
        if cid in self._pending:
            raise InvalidRequestError(f"call {cid} is already waiting in this session")
        self._finished.pop(cid, None)  # submitted again: its answer is awaited again
        loop = asyncio.get_running_loop()
        pending = _Pending(
            call_id=cid,
            tool=tool,
            args_hash=""
            if problem
            else _arguments_hash(request["tool_call"]["function"]["arguments"]),
            future=loop.create_future(),
        )
        self._pending[cid] = pending
        handle = CallHandle(self, pending, idempotency_key)
        pending.timer = loop.call_later(
            budget + self.mesh.deadline_grace,
            self._settle_locally,
            cid,
            DeadlineExceededError(f"no answer within {budget * 1000:.0f} ms"),
        )
        if problem is not None:  # the mesh could not even tell which call to answer
            self._settle_locally(cid, problem)
            return handle
        pending.task = asyncio.create_task(self._publish(request, loop.time() + budget))
        return handle

    async def call(
        self,
        name: str | ToolCall | Mapping[str, Any],
        arguments: str | Mapping[str, Any] | None = None,
        *,
        call_id: str | None = None,
        timeout: float | None = None,
        attempt_timeout: float | None = None,
        idempotency_key: str | None = None,
        context: Mapping[str, Any] | None = None,
        agent_context: Mapping[str, Any] | None = None,
        agent: str | None = None,
        edge_params: Sequence[str] | None = None,
    ) -> ToolMessage:
        """Submits a call and returns its final message; a failed call raises its typed error.
        Options are those of :meth:`submit`.

        Cancelling the task that awaits it (``task.cancel()``, ``asyncio.timeout``) cancels the
        call in the mesh too: a call not yet started never runs, a running one is aborted. The
        same call id may be submitted again at once; it gets the call's state in the mesh (its
        ``cancelled`` answer, or the result of a call that had ended first)."""
        handle = await self.submit(
            name,
            arguments,
            call_id=call_id,
            timeout=timeout,
            attempt_timeout=attempt_timeout,
            idempotency_key=idempotency_key,
            context=context,
            agent_context=agent_context,
            agent=agent,
            edge_params=edge_params,
        )
        try:
            return await handle.result()
        except asyncio.CancelledError:
            self._abandon(handle)
            raise

    async def submit_all(
        self,
        tool_calls: Sequence[ToolCall | Mapping[str, Any]],
        *,
        timeout: float | None = None,
        attempt_timeout: float | None = None,
        context: Mapping[str, Any] | None = None,
        agent_context: Mapping[str, Any] | None = None,
        agent: str | None = None,
    ) -> list[CallHandle]:
        """Submits a whole OpenAI ``tool_calls`` array; the calls run in parallel, each under
        its entry's id. The options apply to every call (see :meth:`submit`)."""
        return [
            await self.submit(
                call,
                timeout=timeout,
                attempt_timeout=attempt_timeout,
                context=context,
                agent_context=agent_context,
                agent=agent,
            )
            for call in tool_calls
        ]

    async def run_tool_calls(
        self,
        message: Mapping[str, Any],
        *,
        name_map: NameMap | None = None,
        timeout: float | None = None,
        attempt_timeout: float | None = None,
        context: Mapping[str, Any] | None = None,
        agent_context: Mapping[str, Any] | None = None,
        agent: str | None = None,
    ) -> list[ToolMessage]:
        """Runs the ``tool_calls`` of an OpenAI assistant message and returns the tool messages
        to append to the conversation, in the same order (errors included, as messages). Each
        call id is the model's tool-call id, so its idempotency key stays the same when the same
        message is run again. ``name_map`` (from :func:`to_openai_tools`) maps names back.
        Cancelling the awaiting task cancels the calls in the mesh, as :meth:`call` does."""
        calls = from_openai_tool_calls(message.get("tool_calls"), name_map)
        handles = await self.submit_all(
            calls,
            timeout=timeout,
            attempt_timeout=attempt_timeout,
            context=context,
            agent_context=agent_context,
            agent=agent,
        )
        try:
            return list(await asyncio.gather(*(h.message() for h in handles)))
        except asyncio.CancelledError:
            for handle in handles:
                self._abandon(handle)
            raise

    def _abandon(self, handle: CallHandle) -> None:
        """The task awaiting a call was cancelled: the call is cancelled in the mesh (in the
        background: the task is on its way out) and settles here at once with ``cancelled``."""
        pending = self._pending.get(handle.call_id)
        if pending is None or pending is not handle._pending:
            return  # it had settled
        call_id = handle.call_id
        task = asyncio.get_running_loop().create_task(
            self.cancel(call_id, idempotency_key=handle._key)
        )
        self._cancelling[call_id] = task

        def forget(done: asyncio.Task[CancelReply]) -> None:
            if self._cancelling.get(call_id) is done:
                del self._cancelling[call_id]
            if not done.cancelled():
                done.exception()  # read; cancel() reports failures in its reply

        task.add_done_callback(forget)
        self._settle_locally(
            call_id, CallCancelledError("the task awaiting the call was cancelled")
        )

    async def cancel(self, call_id: str, *, idempotency_key: str | None = None) -> CancelReply:
        """Asks the mesh to cancel a call of this session (see :meth:`CallHandle.cancel`).
        A failed request is reported as ``state: "unknown"`` with its error."""
        request: CancelRequest = {"tool_call_id": call_id, "session_id": self.id}
        if idempotency_key is not None:
            request["idempotency_key"] = idempotency_key
        try:
            reply = await self.mesh._request(self._subjects.cancel(self.id), request, "resolver")
        except ToolmeshError as err:
            return {"cancelled": False, "state": "unknown", "error": err.to_wire()}
        return cast(CancelReply, reply)

    async def confirm(
        self,
        call_id: str,
        confirm: bool,
        *,
        reason: str | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Confirms (``True``) or declines one of this session's calls that waits for its
        caller (``@approval("caller")``): confirmed, it runs once; declined, it ends with
        ``approval_denied``. A second answer is refused: a decision counts once. Returns the
        ApprovalReply; a failed request is ``{"ok": False, "error": ...}``."""
        request: dict[str, Any] = {
            "tool_call_id": call_id,
            "session_id": self.id,
            "confirm": confirm,
        }
        if idempotency_key is not None:
            request["idempotency_key"] = idempotency_key
        if reason is not None:
            request["reason"] = reason
        try:
            reply = await self.mesh._request(self._subjects.confirm(self.id), request, "resolver")
        except ToolmeshError as err:
            return {"ok": False, "error": err.to_wire()}
        return dict(reply)

    # ---- events ----

    async def events(self) -> AsyncIterator[SessionEvent]:
        """Every event of the session from now on, until the session closes. Each iterator
        gets every event: several listeners can follow one session."""
        await self.open()
        queue: asyncio.Queue[SessionEvent | None] = asyncio.Queue()
        self._listeners.add(queue)
        try:
            while True:
                event = await queue.get()
                if event is None:
                    return
                yield event
        finally:
            self._listeners.discard(queue)

    def catch_up(self) -> None:
        """Reads, from the sessions stream, the answers of every call still waiting, at once and
        again 1 s and 5 s later (done after each reconnect: answers published while the
        connection was down are not redelivered)."""
        loop = asyncio.get_running_loop()
        self._look_up_all()
        for delay in _CATCH_UP_AGAIN:
            self._catch_up_timers.add(loop.call_later(delay, self._look_up_all))

    def _look_up_all(self) -> None:
        for call_id in list(self._pending):
            self._look_up_stored(call_id)

    def _look_up_stored(self, call_id: str) -> None:
        """Reads a waiting call's stored answers, again while the read fails and it still waits
        (one read per call at a time)."""
        if call_id in self._looking_up or self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._look_up_until_read(call_id))
        self._looking_up[call_id] = task
        task.add_done_callback(lambda _: self._looking_up.pop(call_id, None))
        task.add_done_callback(_ignore_failure)

    async def _look_up_until_read(self, call_id: str) -> None:
        delay = _LOOKUP_RETRY_FIRST
        while call_id in self._pending and not self._closed:
            try:
                await self._answer_from_store(call_id)
                return
            except UnavailableError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _LOOKUP_RETRY_MAX)

    async def close(self) -> None:
        """Stops listening; calls still waiting settle with ``cancelled``."""
        if self._closed:
            return
        self._closed = True
        self.mesh._forget(self)
        for timer in self._catch_up_timers:
            timer.cancel()
        self._catch_up_timers.clear()
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()
        for call_id in list(self._pending):
            self._settle_locally(
                call_id, CallCancelledError("session closed before the answer arrived")
            )
        for queue in self._listeners:
            queue.put_nowait(None)
        for _, waiter in self._schema_waiters:
            if not waiter.done():
                waiter.set_result(None)

    # ---- schema expansion, catalog and groups ----

    async def catalog(
        self,
        *,
        agent: str | None = None,
        bind_agent: bool = False,
        names: CatalogNames = "mesh",
    ) -> Catalog:
        """The compact catalog for this session: the tools it may call, compact, except those
        whose schema it already received. ``bind_agent`` binds the session to the agent.
        ``names="provider_safe"``: each entry's ``name`` is its provider-safe name (OpenAI's and
        Anthropic's ``^[a-zA-Z0-9_-]{1,64}$``) and ``tool`` the mesh name to call."""
        body: CatalogRequest = {"session_id": self.id}
        if names != "mesh":
            body["names"] = names
        chosen = agent or self.agent
        if chosen is not None:
            body["agent"] = chosen
        if bind_agent:
            body["bind_agent"] = True
        return await self.mesh._catalog(body)

    async def describe(self, tools: Sequence[str], *, agent: str | None = None) -> Described:
        """The full schemas of some tools, now (at most 64); they count as sent to the session.
        Tools that cannot be described come back in ``errors``."""
        body: dict[str, Any] = {"session_id": self.id, "tools": list(tools)}
        if (agent or self.agent) is not None:
            body["agent"] = agent or self.agent
        reply = cast(Described, await self.mesh._schema_request("describe", body))
        for schema in reply["schemas"]:
            self._remember_schema(schema, [])
        return reply

    async def expand(self, tool: str, *, agent: str | None = None) -> ToolSchema:
        """Asks for a tool's schema to be sent to this session again (a schema event follows)."""
        body: dict[str, Any] = {"session_id": self.id, "tool": tool}
        if (agent or self.agent) is not None:
            body["agent"] = agent or self.agent
        return cast(Expanded, await self.mesh._schema_request("expand", body))["schema"]

    async def groups(self) -> list[GroupState]:
        """Every tool group and whether it is active for this session."""
        return await self.set_groups()

    async def set_groups(
        self,
        *,
        enable: Sequence[str] = (),
        disable: Sequence[str] = (),
        reset: Sequence[str] = (),
    ) -> list[GroupState]:
        """Switches groups for this session only (winning over the tenant's switches)."""
        body = {"session_id": self.id, **_group_changes(enable, disable, reset)}
        return cast(Groups, await self.mesh._schema_request("groups", body))["groups"]

    async def wait_for_schema(self, tool: str, timeout: float = 5.0) -> bool:
        """Waits for a schema of ``tool`` not yet taken: True at once if one is pending, else
        when one arrives, False after ``timeout`` seconds."""
        if tool in self._pending_schemas:
            return True
        await self.open()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (tool, waiter)
        self._schema_waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                self._schema_waiters.remove(entry)
        return tool in self._pending_schemas

    def take_supplemented_schemas(self) -> list[dict[str, Any]]:
        """The schemas received (events and ``describe``) since the last take, each once, for
        the model's next turn: ``tool``, ``parameters``, ``missing`` and ``description``."""
        out = list(self._pending_schemas.values())
        self._pending_schemas.clear()
        return out

    def received_schemas(self) -> Mapping[str, ToolSchema]:
        """The latest schema received for each tool."""
        return dict(self._schemas)

    def with_received_schemas(self, entries: Sequence[CatalogEntry]) -> list[CatalogEntry]:
        """Catalog entries with every tool whose schema was received in its expanded form."""
        out: list[CatalogEntry] = []
        for entry in entries:
            schema = self._schemas.get(entry["name"])
            if schema is None:
                out.append(entry)
                continue
            expanded: CatalogEntry = {**entry, "parameters": schema["parameters"]}
            if schema["description"].strip():
                expanded["description"] = schema["description"]
            out.append(expanded)
        return out

    # ---- internals ----

    async def _publish(self, request: CallRequest, deadline: float) -> None:
        """Publishes a call under one random message id, again while the server does not
        answer and the deadline allows; a duplicate PubAck is answered from the store."""
        call_id = request["tool_call"]["id"]
        loop = asyncio.get_running_loop()
        msg_id = str(uuid.uuid4())
        payload = _encode(request)
        subject = self._subjects.calls(self.id)
        delay = 0.1
        while True:
            try:
                ack = await self.mesh.js.publish(
                    subject,
                    payload,
                    timeout=max(0.25, min(2.0, deadline - loop.time())),
                    headers={"Nats-Msg-Id": msg_id},
                )
            except Exception as err:  # every failure is typed and settles the call
                error = _publish_error(err, subject)
                if (
                    not error.retryable
                    or loop.time() + delay >= deadline
                    or call_id not in self._pending
                ):
                    self._settle_locally(call_id, error)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self._submitted(call_id, ack.seq)
            if ack.duplicate:
                self._look_up_stored(call_id)
            return

    def _submitted(self, call_id: str, seq: int) -> None:
        if call_id not in self._pending:
            return
        self._seq_of[call_id] = seq
        self._call_at[seq] = call_id
        early = self._early_rejections.pop(seq, None)
        if early is not None:
            self._settle(call_id, _without_seq(early))

    async def _answer_from_store(self, call_id: str) -> None:
        """Reads the stored answers of a waiting call, in the protocol's order: the rejection of
        its submission (by the PubAck's sequence), then its result, which settles it only if it
        names the submission's arguments and tool; if it names others, the submission's own
        rejection may have been stored since, so that is read once more."""
        seq = self._seq_of.get(call_id)
        if seq is not None:
            await self._rejection_from_store(seq)
        pending = self._pending.get(call_id)
        if pending is None:
            return
        stored = await self.mesh._last_stored(self._subjects.result(self.id, call_id))
        if stored is None or not _is_tool_message(stored):
            return
        self._deliver(SessionEvent("result", stored))
        if call_id in self._pending and seq is not None:
            await self._rejection_from_store(seq)

    async def _rejection_from_store(self, seq: int) -> None:
        rejected = await self.mesh._last_stored(self._subjects.rejected(self.id, seq))
        if rejected is not None and _is_rejection(rejected):
            self._deliver(SessionEvent("rejected", rejected))

    async def _on_message(self, msg: Msg) -> None:
        kind = Subjects.event_kind(msg.subject)
        if kind is None:
            return
        try:
            body = json.loads(msg.data)
        except ValueError:
            return  # not ours to understand; the session goes on
        if not isinstance(body, dict):
            return
        # Within a tenant's account the server delivers a JetStream answer to whatever reply
        # subject the requester named, so one frontend of the tenant can place another
        # session's stored message on this session's subjects: a final message or progress
        # naming another session, or a result whose subject names another call, is not ours.
        if (
            kind in ("result", "rejected", "progress", "approval")
            and body.get("session_id") != self.id
        ):
            return
        if (
            kind == "result"
            and isinstance(body.get("tool_call_id"), str)
            and body["tool_call_id"]
            and msg.subject != self._subjects.result(self.id, body["tool_call_id"])
        ):
            return
        if kind == "result" and _is_tool_message(body):
            self._deliver(SessionEvent("result", body))
        elif kind == "rejected" and _is_rejection(body):
            self._deliver(SessionEvent("rejected", body))
        elif kind == "approval" and isinstance(body.get("tool_call_id"), str):
            self._deliver(SessionEvent("approval", body))
        elif kind == "progress" and isinstance(body.get("tool_call_id"), str):
            pending = self._pending.get(body["tool_call_id"])
            if pending is not None:
                pending.progress.append(cast(ProgressEvent, body))
                pending.wake()
            self._deliver(SessionEvent("progress", body))
        elif kind == "schema":
            tool = body.get("tool")
            if _is_schema_event(body):
                event = cast(SchemaEvent, body)
                self._remember_schema(event, event["missing"])
            self._deliver(SessionEvent("schema", body, tool if isinstance(tool, str) else ""))

    def _deliver(self, event: SessionEvent) -> None:
        """Settles the call a final message answers and tells the listeners. The same final
        message can arrive twice (live, and from the stream after a reconnect): a repeat is
        dropped; a different one (an operator's replay) is not."""
        if event.type == "result":
            message = cast(ToolMessage, event.body)
            call_id = message["tool_call_id"]
            # A digest, not the message: remembering thousands of large results costs no more
            # than remembering small ones.
            digest = hashlib.sha256(json.dumps(message, sort_keys=True).encode()).hexdigest()
            if self._finished.get(call_id) == digest:
                return
            self._finished.pop(call_id, None)
            self._finished[call_id] = digest
            while len(self._finished) > _FINISHED_REMEMBERED:
                self._finished.popitem(last=False)
            if _answers(self._pending.get(call_id), message):
                self._settle(call_id, message)
        elif event.type == "rejected":
            rejection = cast(Rejection, event.body)
            seq = rejection["seq"]
            owner = self._call_at.get(seq)
            if owner is not None:
                self._settle(owner, _without_seq(rejection))
            else:
                self._early_rejections[seq] = rejection
                while len(self._early_rejections) > _EARLY_REJECTIONS_REMEMBERED:
                    self._early_rejections.popitem(last=False)
        for queue in self._listeners:
            queue.put_nowait(event)

    def _events_denied(self, error: ToolmeshError) -> None:
        """NATS refused this connection the session's events: its waiting calls settle with
        ``error`` now, and so do the ones submitted after."""
        self._denied = error
        for call_id in list(self._pending):
            self._settle_locally(call_id, error)

    def _settle_locally(self, call_id: str, error: ToolmeshError) -> None:
        pending = self._pending.get(call_id)
        message: ToolMessage = {
            "role": "tool",
            "tool_call_id": call_id,
            "name": pending.tool if pending else "",
            "content": f"Error: {error.message}",
            "error": error.to_wire(),
            "session_id": self.id,
            "attempts": 0,
        }
        self._settle(call_id, message)

    def _settle(self, call_id: str, message: ToolMessage) -> None:
        pending = self._pending.pop(call_id, None)
        if pending is None:
            return
        seq = self._seq_of.pop(call_id, None)
        if seq is not None:
            self._call_at.pop(seq, None)
        if pending.timer is not None:
            pending.timer.cancel()
        if not pending.future.done():
            pending.future.set_result(message)
        pending.wake()

    def _remember_schema(self, schema: ToolSchema | SchemaEvent, missing: Sequence[str]) -> None:
        tool = schema["tool"]
        known = self._schemas.get(tool)
        if known is None or known["revision"] <= schema["revision"]:
            fields = {k: v for k, v in schema.items() if k in ToolSchema.__annotations__}
            self._schemas[tool] = cast(ToolSchema, fields)
        earlier = self._pending_schemas.get(tool, {}).get("missing", [])
        merged = list(dict.fromkeys([*earlier, *missing]))
        entry: dict[str, Any] = {
            "tool": tool,
            "parameters": schema["parameters"],
            "missing": merged,
        }
        if schema["description"].strip():
            entry["description"] = schema["description"]
        self._pending_schemas[tool] = entry
        for wanted, waiter in list(self._schema_waiters):
            if wanted == tool and not waiter.done():
                waiter.set_result(None)


# ---- helpers ----


class _Environment:
    """The variables :func:`connect` falls back on; an empty value counts as unset, as it does
    for the mesh's own processes."""

    def get(self, variable: str) -> str | None:
        return os.environ.get(variable) or None

    def servers(self) -> list[str]:
        urls = [url.strip() for url in (self.get("NATS_URL") or "").split(",") if url.strip()]
        return urls or ["nats://127.0.0.1:4222"]


# What nats-server says when it refuses a client's credentials.
_REFUSED_CREDENTIALS = ("authorization violation", "authentication", "user authentication")


def _is_refused_credentials(errors: Sequence[BaseException]) -> bool:
    return any(
        isinstance(err, nats.errors.AuthorizationError)
        or any(text in str(err).lower() for text in _REFUSED_CREDENTIALS)
        for err in errors
    )


_generated = 0


def _new_call_id() -> str:
    global _generated
    _generated += 1
    return f"call_{int(time.time() * 1000):x}_{_generated:x}_{uuid.uuid4().hex[:8]}"


def _build_request(
    session_id: str,
    name: str,
    arguments: str | Mapping[str, Any] | None,
    *,
    call_id: str | None = None,
    timeout: float | None = None,
    attempt_timeout: float | None = None,
    idempotency_key: str | None = None,
    context: Mapping[str, Any] | None = None,
    agent_context: Mapping[str, Any] | None = None,
    agent: str | None = None,
    edge_params: Sequence[str] | None = None,
) -> CallRequest:
    args: str | dict[str, Any] = arguments if isinstance(arguments, str) else dict(arguments or {})
    request: CallRequest = {
        "tool_call": {
            "id": call_id or _new_call_id(),
            "type": "function",
            "function": {"name": name, "arguments": args},
        },
        "session_id": session_id,
    }
    if idempotency_key is not None:
        request["idempotency_key"] = idempotency_key
    if context is not None:
        request["context"] = dict(context)
    if agent_context is not None:
        request["agent_context"] = dict(agent_context)
    if agent is not None:
        request["agent"] = agent
    if timeout is not None:
        request["timeout_ms"] = round(timeout * 1000)
    if attempt_timeout is not None:
        request["attempt_timeout_ms"] = round(attempt_timeout * 1000)
    if edge_params is not None:
        request["edge_params"] = list(edge_params)
    return request


def _nests_deeper_than(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _local_problem(request: CallRequest) -> ToolmeshError | None:
    """Why a request cannot be sent at all, in the resolver's own terms; None when it can."""
    args = request["tool_call"]["function"]["arguments"]
    if isinstance(args, dict) and _nests_deeper_than(args, MAX_ARGUMENT_DEPTH):
        return InvalidArgumentsError(
            f"function.arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels",
            details={"max_depth": MAX_ARGUMENT_DEPTH},
        )
    for field_name in ("context", "agent_context"):
        value = request.get(field_name)
        if value is not None and _nests_deeper_than(value, MAX_ARGUMENT_DEPTH):
            return InvalidRequestError(
                f"{field_name} nests deeper than {MAX_ARGUMENT_DEPTH} levels",
                details={"field": field_name, "max_depth": MAX_ARGUMENT_DEPTH},
            )
    call_id = request["tool_call"]["id"]
    if not 1 <= len(call_id) <= 256:
        return InvalidRequestError("tool_call.id must hold 1 to 256 characters")
    if not request["tool_call"]["function"]["name"]:
        return InvalidRequestError("function.name must not be empty")
    try:
        _encode(request)
    except (TypeError, ValueError) as err:
        return InvalidArgumentsError(f"the call cannot be encoded as JSON: {err}")
    return None


def _encode(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _as_json_text(request: CallRequest) -> None:
    """Sends object arguments as the JSON text this client wrote, so the ``args_hash`` the mesh
    stamps on final messages (the hash of the arguments as submitted) is the one computed here,
    whatever JavaScript would print for the same object (``1.0`` is ``1`` there)."""
    function = request["tool_call"]["function"]
    if not isinstance(function["arguments"], str):
        function["arguments"] = _encode(function["arguments"]).decode()


def _arguments_hash(arguments: str | Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the arguments as submitted: the JSON text."""
    text = arguments if isinstance(arguments, str) else _encode(arguments).decode()
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _group_changes(
    enable: Sequence[str], disable: Sequence[str], reset: Sequence[str]
) -> dict[str, list[str]]:
    body: dict[str, list[str]] = {}
    if enable:
        body["enable"] = list(enable)
    if disable:
        body["disable"] = list(disable)
    if reset:
        body["reset"] = list(reset)
    return body


def _ok_or_raise(reply: dict[str, Any]) -> dict[str, Any]:
    if reply.get("ok") is True:
        return reply
    error = reply.get("error")
    if reply.get("ok") is False and isinstance(error, dict):
        raise ToolmeshError.from_wire(cast(Any, error))
    raise InternalError("the service sent a reply of another shape")


def _publish_error(err: Exception, subject: str) -> ToolmeshError:
    """A NATS publish failure as a typed error (retryable ones are published again)."""
    if isinstance(err, ToolmeshError):
        return err
    if isinstance(err, nats.errors.MaxPayloadError):
        return PayloadTooLargeError(
            "message is larger than the server's max_payload", details={"subject": subject}
        )
    if isinstance(err, nats.js.errors.APIError):
        if err.err_code == JS_ERR_MESSAGE_TOO_LARGE:
            return PayloadTooLargeError(
                "message is larger than the stream's max_msg_size", details={"subject": subject}
            )
        if err.err_code == JS_ERR_STREAM_FULL and "per subject" in (err.description or ""):
            # The calls stream keeps at most TOOLMESH_MAX_QUEUED_CALLS_PER_SESSION per session.
            return OverloadedError(
                "too many calls of this session are waiting to be resolved: "
                "wait for answers, then submit again",
                details={
                    "subject": subject,
                    "limit": "queued_per_session",
                    "retry_after_ms": 1000,
                },
            )
        if err.err_code == JS_ERR_STREAM_FULL and (err.description or "").startswith(
            "maximum messages exceeded"
        ):
            # A calls stream at its max_msgs: the tenant's own or the mesh's (ADR 0048).
            return OverloadedError(
                "too many calls are waiting to be resolved (of this tenant, or in the whole "
                "mesh): wait for answers, then submit again",
                details={"subject": subject, "limit": "queued", "retry_after_ms": 1000},
            )
        if err.err_code == JS_ERR_STREAM_FULL and (err.description or "").startswith(
            "maximum bytes exceeded"
        ):
            # A stream at its max_bytes: the tenant's calls stream or the mesh's share (ADR 0050).
            return OverloadedError(
                "the stream holding this message has used up its bytes: "
                "wait for answers, then submit again",
                details={"subject": subject, "limit": "stored_bytes", "retry_after_ms": 1000},
            )
        if err.err_code in _STREAM_FULL_CODES:
            return OverloadedError(
                f"stream refused the message: {err.description}",
                details={"subject": subject, "retry_after_ms": 1000},
            )
    if isinstance(err, nats.errors.ConnectionClosedError):
        return UnavailableError("the NATS connection is closed", retryable=False)
    if isinstance(err, (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError)):
        # JetStream answers no one on that subject, though it answers others all the while.
        return UnavailableError(
            f"no stream took the message on {subject}: none stores that subject "
            "(check the subject prefix and the tenant; toolmesh setup makes the streams), "
            "or its leader is being elected",
            details={"subject": subject},
        )
    if isinstance(err, (nats.errors.TimeoutError, asyncio.TimeoutError)):
        return UnavailableError(f"JetStream did not accept the message on {subject}")
    return UnavailableError(str(err) or type(err).__name__)


def _answers(pending: _Pending | None, message: ToolMessage) -> bool:
    """Whether a final message for a waiting call's id answers its own submission: one stamped
    with other arguments or naming another tool (``args_hash``) ended a call that reused the id,
    and the submission gets its own rejection instead. One without ``args_hash`` answers it."""
    hashed = message.get("args_hash")
    if pending is None or not isinstance(hashed, str):
        return True
    return hashed == pending.args_hash and message["name"] == pending.tool


def _without_seq(rejection: Rejection) -> ToolMessage:
    message = {k: v for k, v in rejection.items() if k != "seq"}
    return cast(ToolMessage, message)


def _is_tool_message(body: Mapping[str, Any]) -> bool:
    return (
        body.get("role") == "tool"
        and isinstance(body.get("tool_call_id"), str)
        and isinstance(body.get("content"), str)
        and isinstance(body.get("name"), str)
        and isinstance(body.get("session_id"), str)
        and ("error" not in body or _is_wire_error(body["error"]))
    )


def _is_rejection(body: Mapping[str, Any]) -> bool:
    return _is_tool_message(body) and isinstance(body.get("seq"), int) and "error" in body


def _is_wire_error(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("code"), str)
        and isinstance(value.get("message"), str)
        and isinstance(value.get("retryable"), bool)
    )


def _is_schema_event(body: Mapping[str, Any]) -> bool:
    return (
        isinstance(body.get("tool"), str)
        and isinstance(body.get("revision"), int)
        and isinstance(body.get("parameters"), dict)
        and isinstance(body.get("description"), str)
        and isinstance(body.get("missing"), list)
    )


def _ignore_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # read, so asyncio does not log it; the live subscription goes on
