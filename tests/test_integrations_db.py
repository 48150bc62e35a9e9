"""Database clients on socknotify_loop against real servers the tests start.

psycopg 3's async API needs ``add_reader``/``add_writer`` (it refuses
ProactorEventLoop outright); asyncpg and redis-py use transports. All three
run on Linux against servers these fixtures start and, through
tools/wine, in Windows CPython under Wine against the servers the Linux
side started (reached through loopback). Warnings are errors.
"""
from __future__ import annotations

import asyncio
import gc
import sys

import pytest
from servers import need, run_on_loop

# pg_dsn, redis_url (tests/conftest.py): a PostgreSQL and a redis-server
# started for this run, or the addresses python -m tools.wine (or the developer)
# put in the environment.

pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture(autouse=True, scope="module")
def _finalise_earlier_garbage():
    """What earlier modules left to the garbage collector is finalised now,
    not during these tests, whose warnings are errors: PyPy collects late,
    and an unclosed socket's ResourceWarning would land in the wrong test."""
    gc.collect()

# -- psycopg 3 ------------------------------------------------------------------------------

def _psycopg():
    psycopg = need("psycopg", "psycopg[binary]")
    if sys.platform == "win32":
        # The compiled implementation is the one Windows users get from the wheel.
        assert psycopg.pq.__impl__ == "binary", psycopg.pq.__impl__
    return psycopg


def test_psycopg_async_connection(pg_dsn):
    psycopg = _psycopg()

    async def main():
        conn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
        other = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
        async with conn, other:
            await conn.execute(
                "CREATE TEMP TABLE items (id int PRIMARY KEY, name text, blob bytea)")
            rows = [(i, f"item {i}", bytes([i % 251]) * (i * 37)) for i in range(300)]
            async with conn.cursor() as cur:
                await cur.executemany("INSERT INTO items VALUES (%s, %s, %s)", rows)
                await cur.execute("SELECT id, name, blob FROM items ORDER BY id")
                assert await cur.fetchall() == rows
                # A result much larger than a socket buffer: many readiness waits.
                await cur.execute("SELECT repeat('x', 4000000)")
                assert (await cur.fetchone())[0] == "x" * 4000000
                async with cur.copy("COPY (SELECT id FROM items ORDER BY id) TO STDOUT") as copy:
                    assert [int(row[0]) async for row in copy.rows()] == list(range(300))

            # One connection blocks in the server on a lock the other holds; the
            # loop must keep serving the other to release it (a loop that blocked
            # in the first query would deadlock here, ending in the timeout).
            await other.execute("SELECT pg_advisory_lock(4242)")
            waiter = asyncio.ensure_future(conn.execute("SELECT pg_advisory_lock(4242)"))
            for _ in range(500):
                cur = await other.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                if (await cur.fetchone())[0] == 1:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the second session never waited for the lock")
            assert not waiter.done()
            await other.execute("SELECT pg_advisory_unlock(4242)")
            await asyncio.wait_for(waiter, 30)
            await conn.execute("SELECT pg_advisory_unlock(4242)")

    run_on_loop(main)


def test_psycopg_async_pool(pg_dsn):
    _psycopg()
    pool_module = need("psycopg_pool", "psycopg-pool")

    async def main():
        async with pool_module.AsyncConnectionPool(
                pg_dsn, min_size=2, max_size=4, open=False, timeout=30) as pool:
            await pool.wait(timeout=30)

            async def query(i):
                async with pool.connection() as conn:
                    cur = await conn.execute("SELECT %s::int * 3, pg_sleep(0.005)", (i,))
                    return (await cur.fetchone())[0]

            assert await asyncio.gather(*(query(i) for i in range(60))) == \
                [3 * i for i in range(60)]
            # Two connections held at once are two server sessions.
            async with pool.connection() as first, pool.connection() as second:
                pids = set()
                for conn in (first, second):
                    cur = await conn.execute("SELECT pg_backend_pid()")
                    pids.add((await cur.fetchone())[0])
                assert len(pids) == 2
            stats = pool.get_stats()
            assert stats["requests_num"] >= 62, stats
            assert 2 <= stats["pool_size"] <= 4, stats

    run_on_loop(main)


def test_psycopg_listen_notify(pg_dsn):
    psycopg = _psycopg()

    async def main():
        listener = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
        sender = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
        async with listener, sender:
            await listener.execute("LISTEN socknotify_events")
            # Half sent before we wait (they sit unread in the socket), half
            # while the listener is idle in notifies(): that needs a wakeup.
            for i in range(5):
                await sender.execute("SELECT pg_notify('socknotify_events', %s)", (f"event {i}",))

            async def send_later():
                await asyncio.sleep(0.2)
                for i in range(5, 10):
                    await sender.execute(f"NOTIFY socknotify_events, 'event {i}'")
                    await asyncio.sleep(0.02)

            task = asyncio.ensure_future(send_later())
            received = []
            async for note in listener.notifies(timeout=30, stop_after=10):
                assert note.channel == "socknotify_events"
                assert note.pid == sender.info.backend_pid
                received.append(note.payload)
            await task
            assert received == [f"event {i}" for i in range(10)]

    run_on_loop(main)


# -- asyncpg ----------------------------------------------------------------------------------

def test_asyncpg_connection_pool_listen(pg_dsn):
    asyncpg = need("asyncpg")

    async def main():
        conn = await asyncpg.connect(pg_dsn)
        try:
            await conn.execute("CREATE TEMP TABLE t (id int PRIMARY KEY, name text)")
            records = [(i, f"name {i}") for i in range(1000)]
            await conn.copy_records_to_table("t", records=records)
            rows = await conn.fetch("SELECT id, name FROM t ORDER BY id")
            assert [tuple(row) for row in rows] == records
            statement = await conn.prepare("SELECT name FROM t WHERE id = $1")
            assert await statement.fetchval(777) == "name 777"

            notes: asyncio.Queue = asyncio.Queue()
            await conn.add_listener(
                "socknotify_pg", lambda _conn, pid, channel, payload: notes.put_nowait(payload))
            pool = await asyncpg.create_pool(pg_dsn, min_size=2, max_size=4)
            async with pool:
                values = await asyncio.gather(
                    *(pool.fetchval("SELECT $1::int + 1", i) for i in range(60)))
                assert values == [i + 1 for i in range(60)]
                for i in range(5):
                    await pool.execute(f"NOTIFY socknotify_pg, 'n{i}'")
            got = [await asyncio.wait_for(notes.get(), 30) for _ in range(5)]
            assert got == [f"n{i}" for i in range(5)]
        finally:
            await conn.close()

    run_on_loop(main)


# -- redis-py asyncio -----------------------------------------------------------------------

def test_redis_pipeline_and_pubsub(redis_url):
    redis_asyncio = need("redis.asyncio", "redis")

    async def main():
        client = redis_asyncio.Redis.from_url(redis_url)
        try:
            await client.flushdb()
            async with client.pipeline(transaction=True) as pipe:
                pipe.set("greeting", "hello").incr("counter").incr("counter")
                pipe.get("greeting").rpush("list", *range(100)).lrange("list", 0, -1)
                results = await pipe.execute()
            assert results[:4] == [True, 1, 2, b"hello"]
            assert results[4] == 100
            assert results[5] == [str(i).encode() for i in range(100)]
            big = b"z" * 3_000_000
            await client.set("big", big)
            assert await client.get("big") == big

            pubsub = client.pubsub()
            try:
                await pubsub.subscribe("news")
                confirm = await pubsub.get_message(timeout=10)
                assert confirm and confirm["type"] == "subscribe", confirm
                for i in range(20):
                    assert await client.publish("news", f"item {i}") == 1
                received = []
                while len(received) < 20:
                    message = await pubsub.get_message(ignore_subscribe_messages=True,
                                                       timeout=10)
                    assert message is not None, f"only {len(received)} messages arrived"
                    received.append(message["data"])
                assert received == [f"item {i}".encode() for i in range(20)]
                await pubsub.unsubscribe("news")
            finally:
                await pubsub.aclose()
        finally:
            await client.aclose()

    run_on_loop(main)
