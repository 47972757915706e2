"""A streamed download that stays streamed under Daphne (ASGI) as well as WSGI.

Django serves a StreamingHttpResponse built on a synchronous iterator under ASGI by reading the whole
iterator into a list first (with a warning): a multi-GB checkpoint would sit in the web process's memory
before its first byte went out. `ThreadedStreamingResponse` keeps the synchronous iterator (WSGI and the
test client read it as before) and, under ASGI, takes one chunk at a time from it in the request's own sync
thread (thread-sensitive: the one whose database connection Django closes when the response ends).
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse

_END = object()


class ThreadedStreamingResponse(StreamingHttpResponse):
    async def __aiter__(self):
        parts = iter(self.streaming_content)
        while True:
            part = await sync_to_async(next, thread_sensitive=True)(parts, _END)
            if part is _END:
                return
            yield part
