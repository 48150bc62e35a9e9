"""An ordinary asyncio program: nothing in it knows about socknotify_loop.

Run it unchanged on the loop with the launcher:

    python -m socknotify_loop examples/asyncio_echo.py

It starts a TCP echo server on 127.0.0.1, connects 20 clients that each send
50 lines, checks every echoed byte, and prints which loop ran it.
"""
import asyncio


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while line := await reader.readline():
        writer.write(line)
        await writer.drain()
    writer.close()
    await writer.wait_closed()


async def client(port: int, number: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    echoed = 0
    for i in range(50):
        line = f"client {number} line {i}\n".encode()
        writer.write(line)
        assert await reader.readline() == line
        echoed += len(line)
    writer.close()
    await writer.wait_closed()
    return echoed


async def main() -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        totals = await asyncio.gather(*(client(port, n) for n in range(20)))
    loop = asyncio.get_running_loop()
    print(f"{type(loop).__module__}.{type(loop).__qualname__}: "
          f"20 clients echoed {sum(totals)} bytes, all checked")


if __name__ == "__main__":
    asyncio.run(main())
