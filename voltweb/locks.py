"""Releasing a lock held in Volt's cache (Redis) only by its holder.

Workers take a lock with `cache.add(key, token, timeout=…)` (one wins; a dead holder's lock expires).
Releasing it as `if cache.get(key) == token: cache.delete(key)` is two round trips: a lock that expired
between them and was taken by another worker would be deleted from under it. `release` compares and
deletes in one Lua script on the Redis server, as redis-py's own Lock does.
"""

from __future__ import annotations

from django.core.cache import cache

_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


def release(key: str, token: str) -> bool:
    """Delete `key` if it still holds `token`; True when this call released it."""
    backend = getattr(cache, "_cache", None)  # Django's RedisCache keeps its client and serializer there
    if backend is None or not hasattr(backend, "get_client"):  # a cache without Redis: not atomic
        if cache.get(key) == token:
            return bool(cache.delete(key))
        return False
    full_key = cache.make_and_validate_key(key)
    stored = backend._serializer.dumps(token)  # the bytes cache.add wrote for it
    return bool(backend.get_client(full_key, write=True).eval(_RELEASE, 1, full_key, stored))
