"""What a redis-py error means, in the words of someone setting up a store URL.

redis-py passes the server's own text through: asked for nothing but a
password, a server speaks of ``HELLO`` and ``AUTH <user> <pass>``. The
mistakes of a URL (no password, a wrong one, a database the server does not
have) get a sentence naming the fix (``_client.backend_error`` makes them a
:class:`~uniqjob.errors.StoreRefusedURLError`); everything else keeps the
server's words.
"""

from __future__ import annotations

__all__ = ["NEEDS_PASSWORD", "NO_SUCH_DB", "WRONG_PASSWORD", "url_mistake"]

NEEDS_PASSWORD = (
    "the server needs a password: put it in the URL (redis://:PASSWORD@HOST:6379/0, or ?password=...)"
)
WRONG_PASSWORD = "the server refused the user name or password in the URL: check them"
NO_SUCH_DB = "the server has no database of the URL's number (its `databases` setting; 16 by default)"

# The server's words for each mistake (RESP3's HELLO, RESP2's commands).
_URL_MISTAKES = {
    "HELLO must be called with the client already authenticated": NEEDS_PASSWORD,
    "NOAUTH": NEEDS_PASSWORD,
    "Authentication required": NEEDS_PASSWORD,
    "WRONGPASS": WRONG_PASSWORD,
    "invalid username-password pair": WRONG_PASSWORD,
    "invalid password": WRONG_PASSWORD,
    "DB index is out of range": NO_SUCH_DB,
    "ERR DB index is out of range": NO_SUCH_DB,
}


def url_mistake(text: str) -> str | None:
    """The sentence naming the URL's mistake that the server's error ``text`` stands for; None if none."""
    for start, meaning in _URL_MISTAKES.items():
        if text.startswith(start):
            return meaning
    return None
