"""Browser sessions of the console: who signed in, until when, and the form token.

A session is server-side: the cookie holds an opaque random id (256 bits), never the key
nor anything derived from it. The session keeps the key's id (the audit actor) and the
key's SHA-256 hash, which is looked up again on every request so a revoked or expired key
ends its sessions at once. Sessions live in this process's memory: a restart signs
everyone out, and replicas behind a load balancer need sticky sessions.

Every POST carries the session's CSRF token (a hidden form field, compared in constant
time) and an ``Origin`` (or, without one, ``Referer``) of this very site.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import Request

COOKIE_NAME = "jobcore_ui_session"
CSRF_FIELD = "csrf"
DEFAULT_TTL_SECONDS = 8 * 3600.0


@dataclass
class Session:
    id: str
    key_id: uuid.UUID
    key_hash: str
    csrf: str
    expires_at: float
    # One message for the next page (what the last action did), then gone.
    flash: list[tuple[str, str]] = field(default_factory=list)

    @property
    def actor(self) -> str:
        """Who the audit log names for this session's actions: the key's id, never the key."""
        return f"ui:key:{self.key_id}"


class SessionStore:
    def __init__(self, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> None:
        self.ttl_seconds = ttl_seconds
        self._sessions: dict[str, Session] = {}

    def create(self, key_id: uuid.UUID, key_hash: str) -> Session:
        self._drop_expired()
        session = Session(
            id=secrets.token_urlsafe(32),
            key_id=key_id,
            key_hash=key_hash,
            csrf=secrets.token_urlsafe(32),
            expires_at=time.monotonic() + self.ttl_seconds,
        )
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._sessions.get(session_id)
        if session is None:
            return None
        if session.expires_at <= time.monotonic():
            del self._sessions[session_id]
            return None
        return session

    def end(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def _drop_expired(self) -> None:
        now = time.monotonic()
        for sid in [s.id for s in self._sessions.values() if s.expires_at <= now]:
            del self._sessions[sid]


def same_origin(request: Request) -> bool:
    """Whether a state-changing request comes from a page of this site: its ``Origin``
    header (every current browser sends one on a POST), else its ``Referer``, names the
    scheme, host and port the request was sent to. Neither: refused."""
    claimed = request.headers.get("origin") or request.headers.get("referer")
    if not claimed or claimed == "null":
        return False
    parts = urlsplit(claimed)
    own = request.url
    own_port = own.port or (443 if own.scheme == "https" else 80)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme == own.scheme and parts.hostname == own.hostname and port == own_port


def csrf_matches(session: Session, given: object) -> bool:
    return isinstance(given, str) and secrets.compare_digest(given, session.csrf)
