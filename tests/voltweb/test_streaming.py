"""Downloads stay streamed under ASGI (Daphne serves Volt): Django reads a plain StreamingHttpResponse's
synchronous iterator whole into memory there before sending its first byte."""

from __future__ import annotations

import asyncio

from voltweb.streaming import ThreadedStreamingResponse


def test_under_asgi_a_download_is_read_one_chunk_at_a_time():
    pulled = []

    def chunks():
        for number in range(3):
            pulled.append(number)
            yield f"chunk {number}".encode()

    response = ThreadedStreamingResponse(chunks(), content_type="application/x-tar")

    async def first_then_rest():
        parts = response.__aiter__()
        first = await parts.__anext__()
        seen = list(pulled)
        rest = [part async for part in parts]
        return first, seen, rest

    first, seen_at_first, rest = asyncio.run(first_then_rest())
    assert first == b"chunk 0" and seen_at_first == [0], "the first chunk goes out before the rest is read"
    assert rest == [b"chunk 1", b"chunk 2"]
    assert b"".join(ThreadedStreamingResponse(chunks()).streaming_content) == b"chunk 0chunk 1chunk 2"  # WSGI
